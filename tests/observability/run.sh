#!/usr/bin/env bash
# The alert rules and the Grafana dashboard, proven without a cluster (`make test-observability`):
# 1. `promtool check rules` and `promtool test rules` on deploy/prometheus (every alert fires on
#    its bad series once its `for:` has passed, and stays silent on healthy ones), and the
#    PrometheusRule that prometheusrule.sh wraps around the file carrying its groups unchanged;
# 2. every metric and label the dashboard and the rules name is one the binaries export
#    (tools/check_metric_names.py), read from the debug binaries themselves: the multiplexer in
#    front of tei-sim on loopback, serving TLS (so the certificate series exist) and answering a
#    few calls (so the per-call series exist), scraped on its admin port's /metrics and
#    /upstream/metrics (TEI's te_* series, relayed), a second multiplexer (`file` mode) whose pool
#    has the embedding cache with a shared store where nothing listens, after a few calls (so
#    every teifleet_cache_* series exists: the tiers' from the pool's start, the inputs' from its
#    first call), and `teifleet-operator --print-metrics` (every operator family, one series
#    each, from the operator's own registration);
# 3. the same check on copies with one name broken each, which must fail: a checker that passes
#    everything proves nothing;
# 4. a real Prometheus server scraping the real binaries with the shipped alert expressions loaded,
#    and TeifleetShedding seen firing through Prometheus' own HTTP API while a pool sheds under a
#    burst, after it stayed inactive over the healthy run before it. Prometheus scrapes both
#    multiplexers' admin /metrics and /upstream/metrics every second and evaluates every second;
#    it loads a copy of teifleet-rules.yaml in which only the `for:` lines differ, every one
#    rewritten to `for: 5s` (the shipped 5 to 15 minutes would make a test of that long), and the
#    script checks that every other line, every expression included, is byte for byte the shipped
#    file's. The second multiplexer (pool `burst`, 2 in flight and 4 queued in front of a tei-sim
#    taking 100 ms a call, so about 20 calls a second) gets 5 calls a second from teifleet-load
#    first, then 200 a second on top, each with a 1 s deadline (not held at the door): its queue
#    fills and it sheds most of them (shed_queue_full, shed_deadline).
#    tests/observability/prom.py does the waiting: each wait ends on the state it waits for
#    (bounded, 60 s), and a wait that fails prints Prometheus' view of the rule, its series and its
#    targets. The first multiplexer (pool `default`, no burst) must stay without the alert.
#    Then the cache's multiplexer (pool `cached`, scraped too) gets 5 calls a second of distinct
#    queries, each a miss whose lookup tries the store at port 1 (refused, so it rests 1 s between
#    tries): TeifleetCacheStoreDown must fire for `cached` alone.
# promtool and prometheus come from Debian's prometheus package (tests/cluster/prereqs.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
rules=deploy/prometheus/teifleet-rules.yaml
dashboard=deploy/grafana/teifleet.json

for tool in promtool prometheus; do
    command -v $tool >/dev/null || { echo "$tool is missing: run tests/cluster/prereqs.sh (Debian's prometheus package)" >&2; exit 1; }
done
promtool check rules "$rules"
promtool test rules deploy/prometheus/teifleet-rules.test.yaml
# The PrometheusRule wrapping (docs/operating.md#alerts) carries the file's groups unchanged.
wrapped=$(deploy/prometheus/prometheusrule.sh monitoring release=prometheus)
[[ $(sed -n 1,2p <<<"$wrapped") == $'apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule' ]] \
    || { echo "prometheusrule.sh printed no PrometheusRule" >&2; exit 1; }
diff <(sed -n '/^spec:/,$p' <<<"$wrapped" | tail -n +2 | sed 's/^  //') <(sed -n '/^groups:/,$p' "$rules") \
    || { echo "prometheusrule.sh does not carry teifleet-rules.yaml's groups unchanged" >&2; exit 1; }
echo "PrometheusRule wrapping: the rule file's groups, unchanged"

# The binaries of make unit's build (nothing to compile after it; tools/build-debug.sh says why).
tools/build-debug.sh --quiet
bin=$root/target/debug
work=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

# Our servers listen on port 0 and log (JSON) the addresses they got; tools/bound-ports.py reads
# them back (a port picked here and bound later can be taken in between). Prometheus, which cannot
# say which port it got, takes one free now below the kernel's ephemeral range (where port 0 and
# every outgoing connection land), so only another suite picking alike could take it first.
ports() { tools/bound-ports.py "$work/$1" "${@:2}"; }
prom=$(python3 - <<'PY'
import random, socket
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
for port in random.sample(range(max(1024, low - 12000), low), 2000):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        continue
    finally:
        s.close()
    print(port)
    break
PY
)
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=localhost \
    -addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout "$work/tls.key" -out "$work/tls.crt" 2>"$work/openssl.log" \
    || { cat "$work/openssl.log" >&2; exit 1; }
"$bin/tei-sim" --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --log-format json \
    --fixed-latency 1ms --per-token-latency 0s >"$work/sim.log" 2>&1 &
pids+=($!)
served=$(ports sim.log "TEI simulator serving" addr admin)
read -r sim_grpc sim_admin <<<"$served"
"$bin/teifleet-multiplexer" static --max-in-flight 8 --max-queued 16 --queue-timeout 5s \
    --upstream "http://127.0.0.1:$sim_grpc" --tei-metrics "http://127.0.0.1:$sim_admin/metrics" \
    --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --log-format json \
    --tls-cert "$work/tls.crt" --tls-key "$work/tls.key" --drain-delay 0s >"$work/mux.log" 2>&1 &
pids+=($!)
served=$(ports mux.log "multiplexer serving" admin_addr http_addr)
read -r admin http <<<"$served"
logs() { echo "--- multiplexer log" >&2; tail -30 "$work/mux.log" >&2; echo "--- simulator log" >&2; tail -10 "$work/sim.log" >&2; }
for _ in $(seq 200); do
    curl -sf "http://127.0.0.1:$admin/readyz" >/dev/null 2>&1 && break
    sleep 0.1
done
curl -sf "http://127.0.0.1:$admin/readyz" >/dev/null || { echo "the multiplexer is not ready after 20 s" >&2; logs; exit 1; }
# A few calls, so the series created by a call's end exist (outcomes, the latency histograms).
for input in '"one"' '["two", "three"]'; do
    curl -sf --cacert "$work/tls.crt" "https://127.0.0.1:$http/embed" -H 'content-type: application/json' \
        -d "{\"inputs\": $input}" >/dev/null || { echo "an /embed call failed" >&2; logs; exit 1; }
done
curl -sf "http://127.0.0.1:$admin/metrics" >"$work/multiplexer.prom" || { logs; exit 1; }
curl -sf "http://127.0.0.1:$admin/upstream/metrics" >"$work/tei.prom" || { logs; exit 1; }
# A pool with the embedding cache in front of the same simulator; its store's port 1 has no
# listener, so every read the store is asked fails and the calls go on without it.
cat >"$work/cached.yaml" <<YAML
pools:
  - name: cached
    upstream: http://127.0.0.1:$sim_grpc
    maxInFlight: 8
    maxQueued: 16
    queueTimeout: 5s
    cache: {size: 16Mi, store: {url: "redis://127.0.0.1:1/0", timeout: 5ms}}
YAML
"$bin/teifleet-multiplexer" file --config "$work/cached.yaml" --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
    --http-listen 127.0.0.1:0 --log-format json --drain-delay 0s >"$work/cached-mux.log" 2>&1 &
pids+=($!)
served=$(ports cached-mux.log "multiplexer serving" grpc_addr admin_addr http_addr)
read -r cached_grpc cached_admin cached_http <<<"$served"
cached_logs() { echo "--- cache's multiplexer log" >&2; tail -30 "$work/cached-mux.log" >&2; }
for _ in $(seq 200); do
    curl -sf "http://127.0.0.1:$cached_admin/readyz" >/dev/null 2>&1 && break
    sleep 0.1
done
curl -sf "http://127.0.0.1:$cached_admin/readyz" >/dev/null \
    || { echo "the cache's multiplexer is not ready after 20 s" >&2; cached_logs; exit 1; }
for input in '"one"' '["one", "two"]'; do
    curl -sf "http://127.0.0.1:$cached_http/embed" -H 'content-type: application/json' \
        -d "{\"inputs\": $input}" >/dev/null || { echo "an /embed call to the cached pool failed" >&2; cached_logs; exit 1; }
done
curl -sf "http://127.0.0.1:$cached_admin/metrics" >"$work/cache.prom" || { cached_logs; exit 1; }
"$bin/teifleet-operator" --print-metrics >"$work/operator.prom"

check() { # QUERY_FILE...
    tools/check_metric_names.py --exposition "$work/multiplexer.prom" --exposition "$work/tei.prom" \
        --exposition "$work/operator.prom" --exposition "$work/cache.prom" "$@"
}
check "$dashboard" "$rules"

# The negative self-test: one name broken per copy, each must make the check fail, naming it.
must_fail() { # WHAT EXPECTED-OUTPUT FILE
    local out rc=0
    out=$(check "$3" 2>&1) || rc=$?
    if [[ $rc -ne 1 || $out != *"$2"* ]]; then
        echo "the check did not catch $1 (exit $rc, expected 1 and \"$2\"):" >&2
        echo "$out" >&2
        exit 1
    fi
    echo "self-test: $1 caught"
}
sed 's/teifleet_limit_queued/teifleet_limit_queue/g' "$dashboard" >"$work/renamed-metric.json"
must_fail "a metric renamed in the dashboard" "metric teifleet_limit_queue is not exported" "$work/renamed-metric.json"
sed 's/rate(teifleet_tei_queue_seconds_bucket/rate(teifleet_tei_queue_seconds/' "$rules" >"$work/histogram.yaml"
must_fail "a histogram queried without _bucket in the rules" "(a histogram: query teifleet_tei_queue_seconds_bucket" "$work/histogram.yaml"
sed 's/sum by (namespace, pool) (rate(teifleet_requests_total{outcome="upstream_error"}/sum by (namespace, pool) (rate(teifleet_requests_total{result="upstream_error"}/' \
    "$rules" >"$work/wrong-label.yaml"
must_fail "a label a metric does not have in the rules" "teifleet_requests_total has no label 'result'" "$work/wrong-label.yaml"
sed 's/sum by (namespace, error)/sum by (namespace, reason)/' "$rules" >"$work/wrong-grouping.yaml"
must_fail "a grouping by a label no metric has in the rules" "label 'reason' is on none of" "$work/wrong-grouping.yaml"
sed 's/teifleet_cache_store_seconds_count/teifleet_cache_store_second_count/g' "$rules" >"$work/cache-renamed.yaml"
must_fail "a cache metric renamed in the rules" "metric teifleet_cache_store_second_count is not exported" "$work/cache-renamed.yaml"

# 4. A real Prometheus, the shipped expressions, one alert fired for real.
mkdir "$work/prometheus"
fast=$work/prometheus/teifleet-rules.yaml
sed -E 's/^( +for: ).+$/\15s/' "$rules" >"$fast"
same_but_for() { diff <(grep -vE '^ +for: ' "$rules") <(grep -vE '^ +for: ' "$1"); }
same_but_for "$fast" || { echo "the rule copy differs from $rules beyond its for: lines" >&2; exit 1; }
# Its self-test: a copy with one threshold changed must not pass for the shipped rules.
sed 's/> 0\.05$/> 0.5/' "$fast" >"$work/prometheus/edited.yaml"
! same_but_for "$work/prometheus/edited.yaml" >/dev/null \
    || { echo "the check that the rule copy is the shipped file missed a changed threshold" >&2; exit 1; }
fors=$(grep -cE '^ +for: ' "$rules")
[[ $fors -gt 0 && $(grep -cxE ' +for: 5s' "$fast") -eq $fors ]] \
    || { echo "the rule copy does not have every one of its $fors for: lines at 5s" >&2; exit 1; }
promtool check rules "$fast" >/dev/null
echo "rules for Prometheus: $rules with its $fors for: lines at 5s, every other line unchanged (self-test: a changed threshold caught)"

"$bin/tei-sim" --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --log-format json \
    --fixed-latency 100ms --per-token-latency 0s >"$work/burst-sim.log" 2>&1 &
pids+=($!)
served=$(ports burst-sim.log "TEI simulator serving" addr admin)
read -r burst_sim_grpc burst_sim_admin <<<"$served"
"$bin/teifleet-multiplexer" static --pool burst --max-in-flight 2 --max-queued 4 --queue-timeout 2s \
    --upstream "http://127.0.0.1:$burst_sim_grpc" --tei-metrics "http://127.0.0.1:$burst_sim_admin/metrics" \
    --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --log-format json --drain-delay 0s >"$work/burst-mux.log" 2>&1 &
pids+=($!)
served=$(ports burst-mux.log "multiplexer serving" grpc_addr admin_addr)
read -r burst_grpc burst_admin <<<"$served"
# The multiplexers, as a PodMonitor would find them: `namespace` and `pod` are the target labels.
# The cache's relays no TEI metrics (it was given none), so only its /metrics is scraped.
cat >"$work/prometheus/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - $fast
scrape_configs:
  - job_name: teifleet-multiplexer
    static_configs: &pods
      - targets: ["127.0.0.1:$admin"]
        labels: {namespace: observability, pod: default-0}
      - targets: ["127.0.0.1:$burst_admin"]
        labels: {namespace: observability, pod: burst-0}
  - job_name: teifleet-multiplexer-cached
    static_configs:
      - targets: ["127.0.0.1:$cached_admin"]
        labels: {namespace: observability, pod: cached-0}
  - job_name: tei
    metrics_path: /upstream/metrics
    static_configs: *pods
YAML
prometheus --config.file="$work/prometheus/prometheus.yml" --storage.tsdb.path="$work/prometheus/data" \
    --web.listen-address="127.0.0.1:$prom" >"$work/prometheus.log" 2>&1 &
pids+=($!)
promlogs() {
    logs
    echo "--- burst multiplexer log" >&2; tail -20 "$work/burst-mux.log" >&2
    cached_logs
    echo "--- prometheus log" >&2; tail -20 "$work/prometheus.log" >&2
}
for _ in $(seq 200); do
    curl -sf "http://127.0.0.1:$burst_admin/readyz" >/dev/null 2>&1 && break
    sleep 0.1
done
curl -sf "http://127.0.0.1:$burst_admin/readyz" >/dev/null \
    || { echo "the burst multiplexer is not ready after 20 s" >&2; promlogs; exit 1; }
prom_url=http://127.0.0.1:$prom
tests/observability/prom.py "$prom_url" up 60 || { promlogs; exit 1; }

# Calls with an interactive caller's 1 s deadline: under four queue timeouts, so none waits at the
# pool's door (docs/admission.md#the-door-back-pressure-before-refusal); the queue answers at once.
load() { # RATE NAME: teifleet-load at RATE calls a second on the burst pool, until the end
    "$bin/teifleet-load" --target "http://127.0.0.1:$burst_grpc" --mode open --arrivals constant \
        --rate "$1" --deadline 1s --requests 1000000 --duration 300s --quiet >"$work/$2.log" 2>&1 &
    pids+=($!)
}
load 5 healthy-load
tests/observability/prom.py "$prom_url" quiet TeifleetShedding burst 60 || { promlogs; exit 1; }
load 200 burst-load
tests/observability/prom.py "$prom_url" firing TeifleetShedding burst 60 || { promlogs; exit 1; }

# The cached pool's store is refused at every try: distinct queries (a Zipf mix over a million),
# so nearly every call misses its local tier and asks the store.
"$bin/teifleet-load" --target "http://127.0.0.1:$cached_grpc" --mode open --arrivals constant \
    --rate 5 --zipf 1.1:1000000 --deadline 1s --requests 1000000 --duration 300s --quiet >"$work/cached-load.log" 2>&1 &
pids+=($!)
tests/observability/prom.py "$prom_url" firing TeifleetCacheStoreDown cached 60 || { promlogs; exit 1; }
