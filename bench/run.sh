#!/usr/bin/env bash
# Runs the benchmark scenarios (target/release/teifleet-bench) with a local control plane of their
# own for scenario 6: its state directory and ports differ from the ones `make test`, `make demo`
# and `make cluster-up` use, so a cluster someone else is using is never touched. The control
# plane is stopped afterwards. Without the cluster binaries, scenario 6 is reported as SKIP.
#
# On a machine with more than 2 CPUs the run is pinned to 2 (TEIFLEET_BENCH_CPUS, default 0,1;
# `all` to use every CPU): the targets were set on 2 cores, and the shed-storm scenario is about
# the client, the multiplexer and a CPU-bound backend sharing them.
#
# The binaries measured are target/release-pgo's, the profile-guided build `make bench` makes with
# tools/pgo.sh (the multiplexer as its image ships, and the floor proxy built the same way);
# TEIFLEET_BENCH_BIN_DIR names another directory, e.g. target/release for a plain release build.
#
# `--only LIST` runs some scenarios (by number or name); without 6 (live-limits) in it, no control
# plane is started.
#
# Usage: bench/run.sh full|quick [teifleet-bench flags...], e.g. bench/run.sh quick --only 15
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
cd "$REPO"
MODE="${1:-full}"
shift || true

export TEIFLEET_CLUSTER_DIR="${TEIFLEET_BENCH_CLUSTER_DIR:-$REPO/target/bench-cluster}"
export TEIFLEET_API_PORT="${TEIFLEET_BENCH_API_PORT:-26443}"
export TEIFLEET_ETCD_PORT="${TEIFLEET_BENCH_ETCD_PORT:-22379}"

args=()
case "$MODE" in
  full) ;;
  quick) args+=(--quick --out target/bench-quick) ;;
  *) echo "usage: bench/run.sh full|quick [teifleet-bench flags...]" >&2; exit 2 ;;
esac

# Only scenario 6 needs the control plane: `--only` without it (e.g. `--only 15`) starts none.
needs_cluster=1
prev=""
for arg in "$@"; do
  only=""
  case "$arg" in
    --only=*) only="${arg#--only=}" ;;
    *) [[ "$prev" == --only ]] && only="$arg" ;;
  esac
  if [[ -n "$only" ]]; then
    needs_cluster=0
    IFS=, read -ra wanted <<<"$only"
    for w in "${wanted[@]}"; do
      [[ "$w" == 6 || "$w" == live-limits ]] && needs_cluster=1
    done
  fi
  prev="$arg"
done

BIN_DIR="${TEIFLEET_BENCH_BIN_DIR:-target/release-pgo}"
if [[ " $* " == *" --bin-dir"* ]]; then
  :  # named on the command line: teifleet-bench takes it from there
elif [[ ! -x "$BIN_DIR/teifleet-multiplexer" ]]; then
  echo "[bench] $BIN_DIR has no teifleet-multiplexer (tools/pgo.sh --with-floor-proxy makes it): measuring target/release, a plain release build" >&2
  args+=(--bin-dir target/release)
else
  if [[ target/release/teifleet-multiplexer -nt "$BIN_DIR/teifleet-multiplexer" ]]; then
    echo "[bench] $BIN_DIR/teifleet-multiplexer is older than target/release's: rerun tools/pgo.sh --with-floor-proxy to measure the current code" >&2
  fi
  args+=(--bin-dir "$BIN_DIR")
fi
mkdir -p target/bench-logs
# HAProxy (Debian's package) for scenario 1's and 5's floors beside the bare tonic proxy. Installed
# here when missing and running as root; when it cannot be, its rows are reported as SKIP with the
# reason and the run goes on.
if ! command -v haproxy >/dev/null 2>&1 && [[ ! -x /usr/sbin/haproxy ]]; then
  if (( EUID == 0 )) && command -v apt-get >/dev/null 2>&1; then
    echo "[bench] installing haproxy (Debian) for the HAProxy floors" >&2
    export DEBIAN_FRONTEND=noninteractive
    { apt-get install -y -qq --no-install-recommends haproxy ||
      { apt-get update -qq && apt-get install -y -qq --no-install-recommends haproxy; }; } \
      >target/bench-logs/haproxy-install.log 2>&1 ||
      echo "[bench] haproxy could not be installed (target/bench-logs/haproxy-install.log): its rows will be SKIP" >&2
  else
    echo "[bench] haproxy is not installed and this is not root with apt-get: the HAProxy rows will be SKIP" >&2
  fi
fi
# redis-server (Debian's package) for scenario 22's shared tier (parts 3 and 4), installed the
# same way; without it those rows are SKIP with the reason.
if ! command -v redis-server >/dev/null 2>&1 && [[ ! -x /usr/bin/redis-server ]]; then
  if (( EUID == 0 )) && command -v apt-get >/dev/null 2>&1; then
    echo "[bench] installing redis-server (Debian) for scenario 22's shared tier" >&2
    export DEBIAN_FRONTEND=noninteractive
    { apt-get install -y -qq --no-install-recommends redis-server ||
      { apt-get update -qq && apt-get install -y -qq --no-install-recommends redis-server; }; } \
      >target/bench-logs/redis-install.log 2>&1 ||
      echo "[bench] redis-server could not be installed (target/bench-logs/redis-install.log): scenario 22's Redis rows will be SKIP" >&2
  else
    echo "[bench] redis-server is not installed and this is not root with apt-get: scenario 22's Redis rows will be SKIP" >&2
  fi
fi
# Read before the control plane boots, whose own start-up would count as other work.
TEIFLEET_BENCH_LOAD_BEFORE="$(cut -d' ' -f1 /proc/loadavg)"
export TEIFLEET_BENCH_LOAD_BEFORE
if (( ! needs_cluster )); then
  :
elif tests/cluster/up.sh >target/bench-logs/cluster-up.log 2>&1; then
  trap 'tests/cluster/down.sh >/dev/null 2>&1 || true' EXIT
  args+=(--kubeconfig "$TEIFLEET_CLUSTER_DIR/kubeconfig")
else
  echo "[bench] the local control plane did not start (target/bench-logs/cluster-up.log): scenario 6 will be skipped" >&2
fi
pin=()
cpus="${TEIFLEET_BENCH_CPUS:-0,1}"
if [[ "$cpus" != all ]] && (( $(nproc --all) > 2 )) && command -v taskset >/dev/null; then
  pin=(taskset -c "$cpus")
  echo "[bench] pinned to CPUs $cpus (TEIFLEET_BENCH_CPUS=all to use every CPU)" >&2
fi
"${pin[@]}" target/release/teifleet-bench "${args[@]}" "$@"
