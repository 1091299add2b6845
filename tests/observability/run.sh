#!/usr/bin/env bash
# The alert rules and the Grafana dashboard, proven without a cluster (`make test-observability`):
# 1. `promtool check rules` and `promtool test rules` on deploy/prometheus (every alert fires on
#    its bad series once its `for:` has passed, and stays silent on healthy ones), and the
#    PrometheusRule that prometheusrule.sh wraps around the file carrying its groups unchanged;
# 2. every metric and label the dashboard and the rules name is one the binaries export
#    (tools/check_metric_names.py), read from the debug binaries themselves: the multiplexer in
#    front of tei-sim on loopback, serving TLS (so the certificate series exist) and answering a
#    few calls (so the per-call series exist), scraped on its admin port's /metrics and
#    /upstream/metrics (TEI's te_* series, relayed), and `teifleet-operator --print-metrics`
#    (every operator family, one series each, from the operator's own registration);
# 3. the same check on copies with one name broken each, which must fail: a checker that passes
#    everything proves nothing.
# promtool comes from Debian's prometheus package (tests/cluster/prereqs.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
rules=deploy/prometheus/teifleet-rules.yaml
dashboard=deploy/grafana/teifleet.json

command -v promtool >/dev/null || { echo "promtool is missing: run tests/cluster/prereqs.sh (Debian's prometheus package)" >&2; exit 1; }
promtool check rules "$rules"
promtool test rules deploy/prometheus/teifleet-rules.test.yaml
# The PrometheusRule wrapping (docs/operating.md#alerts) carries the file's groups unchanged.
wrapped=$(deploy/prometheus/prometheusrule.sh monitoring release=prometheus)
[[ $(sed -n 1,2p <<<"$wrapped") == $'apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule' ]] \
    || { echo "prometheusrule.sh printed no PrometheusRule" >&2; exit 1; }
diff <(sed -n '/^spec:/,$p' <<<"$wrapped" | tail -n +2 | sed 's/^  //') <(sed -n '/^groups:/,$p' "$rules") \
    || { echo "prometheusrule.sh does not carry teifleet-rules.yaml's groups unchanged" >&2; exit 1; }
echo "PrometheusRule wrapping: the rule file's groups, unchanged"

cargo build --quiet -p teifleet-multiplexer -p teifleet-tei-sim -p teifleet-operator --bins
bin=$root/target/debug
work=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

# Ports all different and below the kernel's ephemeral range (as tests/clients/run.sh picks them).
read -r sim_grpc sim_admin grpc admin http < <(python3 - 5 <<'PY'
import random, socket, sys
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
held, ports = [], []
for port in random.sample(range(max(1024, low - 12000), low), 2000):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        s.close()
        continue
    held.append(s)
    ports.append(port)
    if len(ports) == int(sys.argv[1]):
        break
print(*ports)
PY
)
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=localhost \
    -addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout "$work/tls.key" -out "$work/tls.crt" 2>"$work/openssl.log" \
    || { cat "$work/openssl.log" >&2; exit 1; }
"$bin/tei-sim" --listen "127.0.0.1:$sim_grpc" --admin-listen "127.0.0.1:$sim_admin" \
    --fixed-latency 1ms --per-token-latency 0s >"$work/sim.log" 2>&1 &
pids+=($!)
"$bin/teifleet-multiplexer" static --max-in-flight 8 --max-queued 16 --queue-timeout 5s \
    --upstream "http://127.0.0.1:$sim_grpc" --tei-metrics "http://127.0.0.1:$sim_admin/metrics" \
    --listen "127.0.0.1:$grpc" --admin-listen "127.0.0.1:$admin" --http-listen "127.0.0.1:$http" \
    --tls-cert "$work/tls.crt" --tls-key "$work/tls.key" --drain-delay 0s >"$work/mux.log" 2>&1 &
pids+=($!)
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
"$bin/teifleet-operator" --print-metrics >"$work/operator.prom"

check() { # QUERY_FILE...
    tools/check_metric_names.py --exposition "$work/multiplexer.prom" --exposition "$work/tei.prom" \
        --exposition "$work/operator.prom" "$@"
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
