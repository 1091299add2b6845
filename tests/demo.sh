#!/usr/bin/env bash
# `make demo`: teifleet end to end, from nothing, on this machine. A real Kubernetes control plane
# with fake L4 GPU nodes, the Helm chart, the operator running as the chart's ServiceAccount, a
# sample EmbeddingPool, its multiplexer sidecar in front of the TEI simulator, stock gRPC calls, a
# burst that overflows the budget, a live budget raise, and a GPU shortage.
#
# Cleans up when done; DEMO_KEEP=1 leaves everything running (then `make demo-down`, which stops
# only the processes this script recorded). Logs stay in target/demo-logs/ after the run.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
cd "$REPO"
export TEIFLEET_CACHE="${TEIFLEET_CACHE:-$HOME/.cache/teifleet}"
export TEIFLEET_CLUSTER_DIR="${TEIFLEET_CLUSTER_DIR:-$REPO/.cluster}"
export KUBECONFIG="$TEIFLEET_CLUSTER_DIR/kubeconfig"
export PATH="$TEIFLEET_CACHE/current:$PATH"
NS=teifleet-demo
POOL=bge-small
# Outside the cluster directory, which cluster-down removes: the logs outlive the run.
RUN="$REPO/target/demo-logs"
PIDS_FILE="$RUN/pids"
SIM_PORT=18081 SIM_ADMIN=19001 MUX_PORT=50051 MUX_ADMIN=19090 OPERATOR_ADMIN=18080
BIN="$REPO/target/debug"

heading() { printf '\n\033[1;36m== %s\033[0m\n' "$1"; [[ $# -gt 1 ]] && printf '\033[2m   look at: %s\033[0m\n' "$2"; return 0; }
pids=()
cleanup() {
  if [[ "${DEMO_KEEP:-}" != 1 ]]; then
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    rm -f "$PIDS_FILE"
  fi
  if [[ "${DEMO_KEEP:-}" != 1 ]]; then
    tests/cluster/down.sh >/dev/null 2>&1 || true
    echo "(cleaned up; DEMO_KEEP=1 keeps the cluster and processes)"
  fi
}
trap cleanup EXIT

start() { # name command...
  local name="$1"; shift
  "$@" >"$RUN/$name.log" 2>&1 &
  pids+=($!)
  # `make demo-down` stops exactly these, and only while they still run the same program.
  echo "$! $1" >>"$PIDS_FILE"
}

require_free_port() { # port what
  if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then
    echo "port $1 ($2) is already in use on 127.0.0.1; stop what listens there (ss -ltnp 'sport = :$1') or run make demo-down" >&2
    exit 1
  fi
}

wait_http() { # port path seconds
  for _ in $(seq $(($3 * 5))); do curl -sf "http://127.0.0.1:$1$2" >/dev/null && return 0; sleep 0.2; done
  echo "timed out waiting for 127.0.0.1:$1$2" >&2; return 1
}

token_kubeconfig() { # namespace serviceaccount file
  local token; token="$(kubectl create token "$2" -n "$1" --duration=1h)"
  cat >"$3" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: "$(kubectl config view --raw -o jsonpath='{.clusters[0].cluster.server}')", certificate-authority: "$TEIFLEET_CLUSTER_DIR/pki/ca.crt"}}]
users: [{name: $2, user: {token: "$token"}}]
contexts: [{name: $2, context: {cluster: local, user: $2}}]
current-context: $2
KUBECONFIG
}

sidecar_limit() { curl -s "http://127.0.0.1:$MUX_ADMIN/metrics" | awk -v s="teifleet_limit_in_flight{pool=\"$POOL\"}" '$1 == s {print $2}'; }

heading "1/9  A real control plane: etcd, kube-apiserver, controller-manager, scheduler, kwok" \
  "four fake nodes; the L4 and H100 nodes advertise nvidia.com/gpu and the GFD product label"
mkdir -p "$RUN"
: >"$PIDS_FILE"
for port in "$SIM_PORT:the TEI simulator" "$SIM_ADMIN:the simulator's admin port" "$MUX_PORT:the sidecar" \
  "$MUX_ADMIN:the sidecar's admin port" "$OPERATOR_ADMIN:the operator's admin port"; do
  require_free_port "${port%%:*}" "${port#*:}"
done
echo "   (the first run on a machine builds Kubernetes, kwok, helm and grpcurl from source: about 10 minutes,"
echo "    progress below; later runs start in seconds)"
tests/cluster/prereqs.sh
tests/cluster/down.sh >/dev/null 2>&1 || true
tests/cluster/up.sh
if [[ ! -x "$TEIFLEET_CACHE/bin/grpcurl-v1.9.4/grpcurl" ]]; then
  GOBIN="$TEIFLEET_CACHE/bin/grpcurl-v1.9.4" CGO_ENABLED=0 go install github.com/fullstorydev/grpcurl/cmd/grpcurl@v1.9.4
fi
GRPCURL="$TEIFLEET_CACHE/bin/grpcurl-v1.9.4/grpcurl"
echo "   building the operator, the multiplexer, the simulator and the load generator (cargo)"
cargo build -p teifleet-operator -p teifleet-multiplexer -p teifleet-tei-sim -p teifleet-load --bins

heading "2/9  helm install teifleet" "the CRD, the operator Deployment and its least-privilege RBAC"
helm install teifleet charts/teifleet -n teifleet-system --create-namespace --wait --timeout 90s
kubectl get deployment,serviceaccount -n teifleet-system

heading "3/9  The operator, running with only the chart ServiceAccount's token" \
  "(kwok runs the chart's pod as a stand-in; the real binary runs here with its identity)"
token_kubeconfig teifleet-system teifleet-operator "$RUN/operator.kubeconfig"
KUBECONFIG="$RUN/operator.kubeconfig" start operator "$BIN/teifleet-operator" --admin-listen "127.0.0.1:$OPERATOR_ADMIN" \
  --log-format pretty --lease-namespace teifleet-system --identity demo-operator
wait_http "$OPERATOR_ADMIN" /readyz 30 && echo "operator ready (logs: $RUN/operator.log)"

heading "4/9  kubectl apply deploy/samples/bge-small-l4.yaml" \
  "two L4 replicas; budget 64 in flight / 256 queued, split into per-replica shares in status"
kubectl create namespace "$NS" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl apply -n "$NS" -f deploy/samples/bge-small-l4.yaml
kubectl wait -n "$NS" --for=condition=Ready "embeddingpool/$POOL" --timeout=60s >/dev/null
kubectl get epool -n "$NS"
kubectl get pods -n "$NS" -o wide
kubectl get epool "$POOL" -n "$NS" -o jsonpath='{range .status.conditions[*]}  {.type}={.status} ({.reason}): {.message}{"\n"}{end}'
echo "  shares: $(kubectl get epool "$POOL" -n "$NS" -o jsonpath='{.status.admission}')"

heading "5/9  The pool's multiplexer sidecar in front of the TEI simulator" \
  "Kubernetes mode, as the operator renders it, with the sidecar ServiceAccount's token"
start tei-sim "$BIN/tei-sim" --listen "127.0.0.1:$SIM_PORT" --admin-listen "127.0.0.1:$SIM_ADMIN" \
  --fixed-latency 20ms --per-token-latency 50us --model-id BAAI/bge-small-en-v1.5
token_kubeconfig "$NS" "$POOL-multiplexer" "$RUN/sidecar.kubeconfig"
KUBECONFIG="$RUN/sidecar.kubeconfig" TEIFLEET_POOL="$POOL" TEIFLEET_NAMESPACE="$NS" TEIFLEET_POD_NAME=demo-sidecar \
  start multiplexer "$BIN/teifleet-multiplexer" --listen "127.0.0.1:$MUX_PORT" --admin-listen "127.0.0.1:$MUX_ADMIN" \
  --upstream "http://127.0.0.1:$SIM_PORT" --log-format pretty --drain-delay 0s
wait_http "$MUX_ADMIN" /readyz 30
echo "sidecar ready; its in-flight limit is the pool's share: $(sidecar_limit)"

heading "6/9  A stock gRPC client (grpcurl, via server reflection) calls tei.v1 through the sidecar"
"$GRPCURL" -plaintext "127.0.0.1:$MUX_PORT" list
"$GRPCURL" -plaintext -d '{"inputs": "teifleet puts the queue where it belongs"}' "127.0.0.1:$MUX_PORT" tei.v1.Embed/Embed \
  | python3 -c 'import json,sys; r=json.load(sys.stdin); print("  embedding of", len(r["embeddings"]), "floats; TEI metadata:", r["metadata"])'

heading "7/9  A burst of 600 concurrent requests: more than this replica's budget (32 in flight + 128 queued)" \
  "RESOURCE_EXHAUSTED answered at once for the overflow, the rest served, TEI never flooded"
"$BIN/teifleet-load" --target "http://127.0.0.1:$MUX_PORT" --mode closed --concurrency 600 --requests 600 --tokens 16
curl -s "http://127.0.0.1:$MUX_ADMIN/metrics" | grep -E '^teifleet_(requests_total|limit_in_flight|limit_queued)' | sed 's/^/  /'
echo "  TEI simulator saw at most $(curl -s "http://127.0.0.1:$SIM_ADMIN/stats" | python3 -c 'import json,sys; print(json.load(sys.stdin)["max_in_flight_observed"])') requests at once"

heading "8/9  kubectl patch spec.concurrency up (512 in flight / 2048 queued), live" \
  "the sidecar's limit changes within a second, no pod restarts; the same burst is now admitted"
pods_before="$(kubectl get pods -n "$NS" -o name | sort)"
start_ms=$(date +%s%3N)
kubectl patch epool "$POOL" -n "$NS" --type merge -p '{"spec":{"concurrency":{"maxInFlight":512,"maxQueued":2048}}}'
until [[ "$(sidecar_limit)" == 256 ]]; do sleep 0.05; done
echo "  sidecar enforces the new share (256 in flight) $(( $(date +%s%3N) - start_ms )) ms after the patch"
"$BIN/teifleet-load" --target "http://127.0.0.1:$MUX_PORT" --mode closed --concurrency 600 --requests 600 --tokens 16
if [[ "$(kubectl get pods -n "$NS" -o name | sort)" == "$pods_before" ]]; then
  echo "  same pods as before the patch: nothing restarted"
else
  echo "  pods changed after the patch!" >&2; exit 1
fi

heading "9/9  Over-asking for GPUs: 5 replicas on 4 L4 GPUs" "Ready=False, reason InsufficientGPU, naming the GPU type"
kubectl scale epool "$POOL" -n "$NS" --replicas=5
kubectl wait -n "$NS" --for=jsonpath='{.status.conditions[0].reason}'=InsufficientGPU "embeddingpool/$POOL" --timeout=60s >/dev/null
kubectl get epool -n "$NS"
kubectl get epool "$POOL" -n "$NS" -o jsonpath='{range .status.conditions[*]}  {.type}={.status} ({.reason}): {.message}{"\n"}{end}'
kubectl get events -n "$NS" --field-selector involvedObject.kind=EmbeddingPool | tail -n 5

heading "Summary"
cat <<SUMMARY
  - helm installed the CRD and operator; the operator ran on the chart's RBAC alone
  - the pool became L4-scheduled TEI pods with status, conditions and per-replica shares
  - stock gRPC calls went through the multiplexer sidecar unchanged
  - a burst beyond the budget was shed at once with RESOURCE_EXHAUSTED instead of queueing in TEI
  - a live spec.concurrency edit reached the sidecar in under a second and the next burst was admitted
  - asking for more GPUs than exist reported InsufficientGPU
  logs: $RUN/*.log
SUMMARY
