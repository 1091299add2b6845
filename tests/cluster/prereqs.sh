#!/usr/bin/env bash
# Installs everything `make test` needs on a fresh machine of this project's kind (Debian with Go
# and rustup): Debian packages, Rust components, the cached control-plane binaries and crane.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# `make deny` runs this cargo-deny (the Makefile reads the version from this line).
CARGO_DENY_VERSION=0.20.2

missing=()
# python3: `make lint`'s tools/rooms.py and the Python client tests.
for tool in openssl curl python3; do command -v "$tool" >/dev/null 2>&1 || missing+=("$tool"); done
if ((${#missing[@]})); then
  echo "[prereqs] installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null && apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# promtool (`make test-observability`: the alert rules' checks and unit tests) comes with Debian's
# prometheus package. Only the tool is wanted: no recommended packages (node-exporter), and the
# server the package starts where systemd runs is stopped and disabled.
if ! command -v promtool >/dev/null 2>&1; then
  echo "[prereqs] installing prometheus (for promtool)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  if [[ -d /run/systemd/system ]]; then systemctl disable --now prometheus.service >/dev/null 2>&1 || true; fi
fi
# redis-server: the embedding cache's shared tier in the multiplexer's tests (multiplexer/tests/it/
# cache, through tools/testkit/src/redis.rs), each starting its own on a loopback port. The
# server the package starts where systemd runs (on 6379) is stopped and disabled: no test uses it.
if ! command -v redis-server >/dev/null 2>&1; then
  echo "[prereqs] installing redis-server (the cache tests' shared store)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends redis-server >/dev/null
  if [[ -d /run/systemd/system ]]; then systemctl disable --now redis-server.service >/dev/null 2>&1 || true; fi
fi

if command -v rustup >/dev/null 2>&1; then
  for component in rustfmt clippy; do
    rustup component list --installed 2>/dev/null | grep -q "^$component" || rustup component add "$component"
  done
fi
command -v go >/dev/null 2>&1 || { echo "[prereqs] Go is required to build the control plane" >&2; exit 1; }

# cargo-deny for `make deny`, built once per version from crates.io with its own lockfile, into a
# cache outside the repository keyed by that version (a few minutes the first time).
CACHE="${TEIFLEET_CACHE:-$HOME/.cache/teifleet}"
deny_root="$CACHE/cargo-deny-$CARGO_DENY_VERSION"
if [[ ! -x "$deny_root/bin/cargo-deny" ]]; then
  echo "[prereqs] building cargo-deny $CARGO_DENY_VERSION into $deny_root" >&2
  cargo install --locked --quiet --version "$CARGO_DENY_VERSION" --root "$deny_root" cargo-deny
fi

# The Go tools below are built once per version into the cache; the first builds on a machine share
# one throwaway set of Go caches (the standard library and many modules in common), removed when
# they are done: they would be read again only for a new version, and on a CI machine they fill
# the disk the real node's kubelet watches for DiskPressure.
TEIFLEET_GO_SCRATCH="$(mktemp -d)"
export TEIFLEET_GO_SCRATCH GOCACHE="$TEIFLEET_GO_SCRATCH/build" GOMODCACHE="$TEIFLEET_GO_SCRATCH/mod"
export GOFLAGS="${GOFLAGS:-} -modcacherw"
trap 'chmod -R u+w "$TEIFLEET_GO_SCRATCH" 2>/dev/null || true; rm -rf "$TEIFLEET_GO_SCRATCH"' EXIT

# SeaweedFS's weed, the real S3 store of the embedding-job tests (built once per version).
"$HERE/../../tools/seaweedfs.sh" >/dev/null
# grpcurl and ghz, which the client tests run as users do (docs/clients.md; issue 32's ghz run).
"$HERE/../../tools/go-tool.sh" grpcurl >/dev/null
"$HERE/../../tools/go-tool.sh" ghz >/dev/null
# A Prometheus server with Kubernetes service discovery, which Debian's lacks: real_pods.rs scrapes
# the real node's pods with it (built once per version).
"$HERE/../../tools/prometheus.sh" >/dev/null
"$HERE/install-binaries.sh"
# crane, for building, checking and pushing images without a Docker engine.
"$HERE/../../images/install-tools.sh" >/dev/null

# The rest of `make test` writes about 6 GB: the debug builds (4.2 GB measured on a fresh clone
# without incremental caches, which .ci/run turns off), the control plane's state, the images and
# the real node's copies of them. A disk short of that fails late and obscurely (a linker's bus
# error, a kubelet evicting pods under DiskPressure), so say so now, with the numbers.
repo_root="$(cd "$HERE/../.." && pwd)"
free_kb=$(df -Pk "$repo_root" | awk 'NR == 2 { print $4 }')
echo "[prereqs] $((free_kb / 1024 / 1024)) GiB free on the repository's filesystem ($repo_root)" >&2
if ((free_kb < 8 * 1024 * 1024)); then
  echo "[prereqs] WARNING: make test needs about 6 GiB free there; expect it to fail for lack of disk" >&2
fi
