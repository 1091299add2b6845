#!/usr/bin/env bash
# Row 6 of the real-TEI scenario (lanes) alone, at a query length of your choice: the full
# scenario (`bench/run.sh full --only real-tei`) runs it for 12 s after five other rows; this runs
# the same loads against the same TEI build in half a minute, so a change to the ingest gate can be
# tried several times, and a longer run tells the queries' start from their steady state.
#
#   bench/real-tei-lanes.sh [BINS] [QUERY_SECONDS] [QUERIES_PER_S]
#
# BINS: the directory holding teifleet-multiplexer and teifleet-load (default target/release);
# QUERY_SECONDS: how long the queries run (default 12, the full scenario's); QUERIES_PER_S: their
# Poisson rate (default 38: 0.6× the 63 texts/s this CPU TEI gives at its best, as row 3 measures).
# TEI comes from the real-TEI cache (`../shared/tools/real-tei.sh`, `$TEIFLEET_REAL_TEI_CACHE` or
# ~/.cache/teifleet/real-tei). Prints each load's percentiles, the p99 ratio beside ÷ alone, and
# the sidecar's ingest let-ins by reason. A diagnostic, not a benchmark: it judges nothing.
set -euo pipefail
BINS=${1:-target/release}
SECS=${2:-12}
RATE=${3:-38}
CACHE=${TEIFLEET_REAL_TEI_CACHE:-$HOME/.cache/teifleet/real-tei}
OUT=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$OUT"' EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
TEI_PORT=$(free_port) TEI_METRICS=$(free_port) GRPC=$(free_port) ADMIN=$(free_port)

HF_HUB_OFFLINE=1 "$CACHE/bin/text-embeddings-router-grpc" --model-id "$CACHE/models/all-MiniLM-L6-v2" \
  --dtype=float32 --hostname=127.0.0.1 --port="$TEI_PORT" --prometheus-port="$TEI_METRICS" \
  --max-concurrent-requests=4096 --uds-path="$OUT/tei.sock" >"$OUT/tei.log" 2>&1 &
pids+=($!)
for _ in $(seq 240); do grep -q Ready "$OUT/tei.log" && break; sleep 0.5; done
grep -q Ready "$OUT/tei.log" || { echo "TEI did not get ready:" >&2; tail "$OUT/tei.log" >&2; exit 1; }

# Row 6's sidecar: row 1's budget (TEI's batch of 4 in flight) and an ingest floor of 10 %.
"$BINS/teifleet-multiplexer" static --listen="127.0.0.1:$GRPC" --admin-listen="127.0.0.1:$ADMIN" \
  --upstream="http://127.0.0.1:$TEI_PORT" --max-in-flight=4 --max-queued=64 --queue-timeout=30000ms \
  --max-concurrent-streams=256 --drain-delay=0s --ingest-share=10 >"$OUT/mux.log" 2>&1 &
pids+=($!)
for _ in $(seq 60); do curl -sf "http://127.0.0.1:$ADMIN/readyz" >/dev/null && break; sleep 0.25; done

load() { "$BINS/teifleet-load" --target "http://127.0.0.1:$GRPC" --tokens 20 --connections 4 --quiet "$@"; }
queries() { load --mode open --rate "$RATE" --duration "${SECS}s" --requests 1000000 --deadline 1s --grace 3s --seed 2106 --json "$1"; }

load --mode closed --concurrency 4 --requests 100 --duration 30s >/dev/null # warm-up, as the scenario's
queries "$OUT/alone.json"
sleep 1
# The ingest flood: 64 closed-loop callers from a second before the queries to a second after.
load --mode closed --concurrency 64 --requests 1000000 --duration "$((SECS + 2))s" --lane ingest --grace 30s \
  --json "$OUT/ingest.json" &
flood=$!
sleep 1
queries "$OUT/beside.json"
wait "$flood"
curl -s "http://127.0.0.1:$ADMIN/metrics" | grep '^teifleet_ingest_let_in_total' || true

python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
runs = {name: json.load(open(f"{out}/{name}.json")) for name in ("alone", "beside", "ingest")}
for name, run in runs.items():
    lat = run["latency"]
    print(f"{name:7} sent {run['sent']:5} ok {run['ok']:5} p50 {lat['p50_ms']:7.1f} ms  p90 {lat['p90_ms']:7.1f} ms  "
          f"p99 {lat['p99_ms']:7.1f} ms  max {lat['max_ms']:7.1f} ms  {run['codes']}")
print(f"query p99 beside ingest ÷ alone: {runs['beside']['latency']['p99_ms'] / runs['alone']['latency']['p99_ms']:.2f}")
PY
