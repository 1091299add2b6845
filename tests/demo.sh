#!/usr/bin/env bash
# `make demo`: a local control plane with fake GPU nodes, the operator, a sample pool on L4s, and
# a live budget change and scale-up, narrated. The cluster stays up afterwards (make cluster-down).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
cd "$REPO"
export TEIFLEET_CLUSTER_DIR="${TEIFLEET_CLUSTER_DIR:-$REPO/.cluster}"
export KUBECONFIG="$TEIFLEET_CLUSTER_DIR/kubeconfig"
export PATH="${TEIFLEET_CACHE:-$HOME/.cache/teifleet}/current:$PATH"
NS=teifleet-demo

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "Starting the local control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok)"
tests/cluster/prereqs.sh
tests/cluster/up.sh
cargo build --quiet -p teifleet-operator

say "Installing the EmbeddingPool CRD and starting the operator"
kubectl apply --server-side -f crds/teifleet.dev_embeddingpools.yaml
target/debug/teifleet-operator --admin-listen 127.0.0.1:18080 --log-format pretty --lease-namespace default \
  >"$TEIFLEET_CLUSTER_DIR/logs/operator.log" 2>&1 &
OPERATOR=$!
trap 'kill $OPERATOR 2>/dev/null || true' EXIT

say "Applying deploy/samples/bge-small-l4.yaml: two L4 replicas, 64 in flight, 256 queued"
kubectl create namespace "$NS" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl apply -n "$NS" -f deploy/samples/bge-small-l4.yaml
kubectl wait -n "$NS" --for=condition=Ready embeddingpool/bge-small --timeout=60s
kubectl get embeddingpool,deployment -n "$NS"
kubectl get pods -n "$NS" -o wide
echo "per-replica shares: $(kubectl get epool/bge-small -n "$NS" -o jsonpath='{.status.admission}')"

say "Editing spec.concurrency.maxInFlight 64 -> 128, live"
start=$(date +%s%N)
kubectl patch epool/bge-small -n "$NS" --type merge -p '{"spec":{"concurrency":{"maxInFlight":128}}}'
until [[ "$(kubectl get epool/bge-small -n "$NS" -o jsonpath='{.status.admission.inFlightPerReplica}')" == 64 ]]; do sleep 0.1; done
echo "new shares in status after $(( ($(date +%s%N) - start) / 1000000 )) ms: $(kubectl get epool/bge-small -n "$NS" -o jsonpath='{.status.admission}')"
kubectl get pods -n "$NS"   # same pods: no restart

say "Scaling to 5 replicas: only 4 L4 GPUs exist, so the pool reports InsufficientGPU"
kubectl scale epool/bge-small -n "$NS" --replicas=5
kubectl wait -n "$NS" --for=jsonpath='{.status.conditions[0].reason}'=InsufficientGPU embeddingpool/bge-small --timeout=60s
kubectl get epool/bge-small -n "$NS" -o jsonpath='{range .status.conditions[*]}{.type}={.status} {.reason}: {.message}{"\n"}{end}'

say "Scaling back to 4: the shortage clears"
kubectl scale epool/bge-small -n "$NS" --replicas=4
kubectl wait -n "$NS" --for=condition=Ready embeddingpool/bge-small --timeout=60s
kubectl get epool -n "$NS"
kubectl get events -n "$NS" --field-selector involvedObject.kind=EmbeddingPool

say "Done. The multiplexer and TEI simulator join this demo with their own work; the cluster is still up:"
echo "  export KUBECONFIG=$KUBECONFIG   # then: kubectl get epool -A"
echo "  make cluster-down"
