#!/usr/bin/env bash
# Builds the multiplexer with profile-guided optimization (PGO), the way its image ships and
# `make bench` measures it: an instrumented build serves a fixed mix of traffic through tei-sim,
# and the final build is optimized with the counts that traffic left (which branches are hot,
# which functions to inline and lay out together). A proxied call's code spans h2, tokio, hyper,
# tonic and ours, more than the instruction cache holds; PGO packs the hot part of it. See
# docs/benchmarks.md ("Profile-guided builds") for what it changed.
#
# The mix covers what the sidecar serves, so no path it takes in production is laid out as cold:
# unary gRPC (Embed, Info, mixed sizes), EmbedStream, TEI's HTTP API, refusals at a full queue,
# gRPC over TLS (when openssl is installed) and a /metrics scrape.
#
# With --with-floor-proxy the benchmarks' floor proxy (teifleet-floor-proxy, both stacks) is
# built the same way, trained on the unary part of the mix, so that the multiplexer is compared
# with a floor built as it is.
#
# Needs target/release/{tei-sim,teifleet-load} (cargo build --release -p teifleet-tei-sim
# -p teifleet-load) and the llvm-tools rustup component (installed here when missing). Writes:
#   target/pgo/generate/   the instrumented build (its own target dir: other RUSTFLAGS)
#   target/pgo/use/        the optimized build (likewise)
#   target/pgo/profile-*.profdata  the merged profile, named by what it depends on
#   OUT (default target/release-pgo): the PGO binaries beside links to the other release binaries,
#   a complete --bin-dir for images/build.sh and teifleet-bench, and BUILD saying how it was made.
#
#   tools/pgo.sh [--out DIR] [--with-floor-proxy]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="$ROOT/target/release-pgo"
FLOOR=0
while (($#)); do
  case "$1" in
    --out) OUT="$(realpath -m "$2")"; shift 2 ;;
    --with-floor-proxy) FLOOR=1; shift ;;
    *) echo "usage: $0 [--out DIR] [--with-floor-proxy]" >&2; exit 2 ;;
  esac
done

log() { echo "[pgo] $*" >&2; }
die() { log "FAIL: $*"; exit 1; }

RELEASE="$ROOT/target/release"
for binary in tei-sim teifleet-load; do
  [[ -x "$RELEASE/$binary" ]] || die "$RELEASE/$binary is missing: cargo build --release --locked -p teifleet-tei-sim -p teifleet-load"
done

host="$(rustc -vV | sed -n 's/^host: //p')"
PROFDATA="$(rustc --print sysroot)/lib/rustlib/$host/bin/llvm-profdata"
if [[ ! -x "$PROFDATA" ]]; then
  log "installing the llvm-tools rustup component (llvm-profdata, matching rustc's LLVM)"
  rustup component add llvm-tools >&2
fi
[[ -x "$PROFDATA" ]] || die "$PROFDATA is missing after rustup component add llvm-tools"

packages=(-p teifleet-multiplexer --bin teifleet-multiplexer)
((FLOOR)) && packages+=(-p teifleet-bench --bin teifleet-floor-proxy)

WORK="$ROOT/target/pgo"
RAW="$WORK/raw"
LOGS="$WORK/logs"
rm -rf "$RAW" "$LOGS"
mkdir -p "$RAW" "$LOGS"

log "instrumented build"
RUSTFLAGS="-Cprofile-generate=$RAW" \
  cargo build --release --locked "${packages[@]}" --target-dir "$WORK/generate"
GEN="$WORK/generate/release"
# RUSTFLAGS reach build scripts and proc macros too, which ran during the build and left their own
# counts here: only the training's belong in the profile.
rm -f "$RAW"/*.profraw

# Fixed loopback ports, checked free first: the script runs alone, before a benchmark or an image.
SIM=47611 MUX=47612 ADMIN=47613 HTTP=47614 TLS=47615 TLS_ADMIN=47616 FLOOR_PORT=47617
for port in $SIM $MUX $ADMIN $HTTP $TLS $TLS_ADMIN $FLOOR_PORT; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then die "port $port on 127.0.0.1 is in use"; fi
done
PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT
wait_for() {
  local port=$1 tries=100
  until (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
    ((--tries)) || die "nothing listens on 127.0.0.1:$port (logs in $LOGS)"
    sleep 0.1
  done
}
# SIGTERM, then wait: the instrumented binaries write their counts as they exit normally.
stop() {
  kill -TERM "$1"
  wait "$1" || die "pid $1 did not exit cleanly after SIGTERM (logs in $LOGS)"
}
load() { "$RELEASE/teifleet-load" --quiet "$@" >>"$LOGS/load.log" 2>&1 || die "teifleet-load $* failed ($LOGS/load.log)"; }

"$RELEASE/tei-sim" --listen "127.0.0.1:$SIM" --fixed-latency=0us --per-token-latency=1000ns >"$LOGS/tei-sim.log" 2>&1 &
PIDS+=($!)
wait_for $SIM
export LLVM_PROFILE_FILE="$RAW/%m-%p.profraw"

log "training the multiplexer"
"$GEN/teifleet-multiplexer" static --upstream "http://127.0.0.1:$SIM" --listen "127.0.0.1:$MUX" \
  --admin-listen "127.0.0.1:$ADMIN" --http-listen "127.0.0.1:$HTTP" --max-in-flight=64 --max-queued=1024 \
  --log-format json >"$LOGS/multiplexer.log" 2>&1 &
mux=$!
PIDS+=($mux)
wait_for $MUX
wait_for $HTTP
grpc=(--target "http://127.0.0.1:$MUX")
load "${grpc[@]}" --rate 1000 --requests 6000 --connections 4 --tokens 20
load "${grpc[@]}" --mode closed --concurrency 1 --requests 2000 --rpc info
load "${grpc[@]}" --mode closed --concurrency 4 --requests 300 --stream-batch 20 --tokens 20
load "${grpc[@]}" --rate 3000 --requests 3000 --connections 8 --tokens-mix 2,20,100
load --target "http://127.0.0.1:$HTTP" --protocol http --rate 500 --requests 1500 --connections 4 --tokens 20
# A Prometheus scrape, without needing curl.
(exec 3<>"/dev/tcp/127.0.0.1/$ADMIN" && printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3 && cat <&3 >/dev/null)
stop $mux

log "training refusals: one call in flight, two queued, at twice what that serves"
"$GEN/teifleet-multiplexer" static --upstream "http://127.0.0.1:$SIM" --listen "127.0.0.1:$MUX" \
  --admin-listen "127.0.0.1:$ADMIN" --http-listen "127.0.0.1:$HTTP" --max-in-flight=1 --max-queued=2 \
  --queue-timeout=50ms --log-format json >"$LOGS/multiplexer-refusing.log" 2>&1 &
mux=$!
PIDS+=($mux)
wait_for $MUX
load "${grpc[@]}" --rate 4000 --requests 4000 --connections 4 --tokens 500 --deadline 200ms
load --target "http://127.0.0.1:$HTTP" --protocol http --rate 2000 --requests 1000 --connections 4 --tokens 500
stop $mux

if command -v openssl >/dev/null 2>&1; then
  log "training gRPC over TLS"
  certs="$WORK/certs"
  mkdir -p "$certs"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=pgo-ca \
    -keyout "$certs/ca.key" -out "$certs/ca.pem" 2>>"$LOGS/openssl.log"
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=localhost \
    -keyout "$certs/server.key" -out "$certs/server.csr" 2>>"$LOGS/openssl.log"
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=critical,CA:FALSE\n' >"$certs/ext"
  openssl x509 -req -in "$certs/server.csr" -CA "$certs/ca.pem" -CAkey "$certs/ca.key" -CAcreateserial \
    -days 1 -extfile "$certs/ext" -out "$certs/server.pem" 2>>"$LOGS/openssl.log"
  "$GEN/teifleet-multiplexer" static --upstream "http://127.0.0.1:$SIM" --listen "127.0.0.1:$TLS" \
    --admin-listen "127.0.0.1:$TLS_ADMIN" --http-listen off --max-in-flight=64 --max-queued=1024 \
    --tls-cert "$certs/server.pem" --tls-key "$certs/server.key" --log-format json >"$LOGS/multiplexer-tls.log" 2>&1 &
  mux=$!
  PIDS+=($mux)
  wait_for $TLS
  load --target "https://127.0.0.1:$TLS" --ca-cert "$certs/ca.pem" --rate 1000 --requests 3000 --connections 4 --tokens 20
  load --target "https://127.0.0.1:$TLS" --ca-cert "$certs/ca.pem" --connection-per-call --rate 200 --requests 300 --tokens 20
  stop $mux
else
  log "openssl is not installed: TLS is left out of the training mix"
fi

if ((FLOOR)); then
  for stack in h2 tonic; do
    log "training the floor proxy on $stack"
    "$GEN/teifleet-floor-proxy" --listen "127.0.0.1:$FLOOR_PORT" --upstream "http://127.0.0.1:$SIM" --stack "$stack" \
      >"$LOGS/floor-$stack.log" 2>&1 &
    floor=$!
    PIDS+=($floor)
    wait_for $FLOOR_PORT
    load --target "http://127.0.0.1:$FLOOR_PORT" --rate 1000 --requests 6000 --connections 4 --tokens 20
    load --target "http://127.0.0.1:$FLOOR_PORT" --mode closed --concurrency 1 --requests 2000 --rpc info
    load --target "http://127.0.0.1:$FLOOR_PORT" --rate 3000 --requests 3000 --connections 8 --tokens-mix 2,20,100
    stop $floor
  done
fi
unset LLVM_PROFILE_FILE

# Named by what the counts depend on (the toolchain, the locked dependencies, this script): cargo
# rebuilds for a change of RUSTFLAGS, not of the file it names, so a new name is what makes it
# rebuild the dependencies with new counts. The counts of one run and the next differ only by
# timing; within one name the dependencies keep the counts they were first built with.
key="$( { rustc -vV; cat Cargo.lock "${BASH_SOURCE[0]}"; echo "$FLOOR"; } | sha256sum | cut -c1-16)"
PROFILE="$WORK/profile-$key.profdata"
"$PROFDATA" merge -o "$PROFILE" "$RAW"
log "profile: $PROFILE ($(find "$RAW" -name '*.profraw' | wc -l) runs)"

log "optimized build"
RUSTFLAGS="-Cprofile-use=$PROFILE -Cllvm-args=-pgo-warn-missing-function=false" \
  cargo build --release --locked "${packages[@]}" --target-dir "$WORK/use"

mkdir -p "$OUT"
for binary in "$RELEASE"/*; do
  [[ -f "$binary" && -x "$binary" ]] || continue
  ln -sfn "$binary" "$OUT/$(basename "$binary")"
done
built=(teifleet-multiplexer)
((FLOOR)) && built+=(teifleet-floor-proxy)
for binary in "${built[@]}"; do
  rm -f "$OUT/$binary"
  cp "$WORK/use/release/$binary" "$OUT/$binary"
done
{
  echo "profile-guided: ${built[*]} (profile $(basename "$PROFILE"), rustc $(rustc -vV | sed -n 's/^release: //p'))"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (modified)')"
} >"$OUT/BUILD"
log "done: $OUT ($(tr '\n' ' ' <"$OUT/BUILD"))"
