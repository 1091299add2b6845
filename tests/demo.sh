#!/usr/bin/env bash
# `make demo`: teifleet end to end, as shipped, from nothing, on this machine. A real Kubernetes
# control plane with fake GPU nodes (kwok) and one real node (a kubelet on containerd with fake L4
# GPUs), the images built here, the Helm chart with the operator running as a pod on the chart's
# ServiceAccount, a sample EmbeddingPool whose TEI is the simulator's image, its pods Running on the
# real node, stock gRPC and HTTP calls through the pool's ClusterIP Service, a burst that overflows
# the budget, a live budget raise without restarts, an EmbeddingJob through the pool, a GPU
# shortage, and a pool that scales itself from zero under a burst and back.
#
# The images are built from the plain release binaries (make images IMAGES_PGO=cached: the
# profile-guided multiplexer only when tools/pgo.sh already built it from the same code), so a
# first run does not wait for the profile-guided build. DEMO_IMAGES_PGO=1 builds it, as releases do.
# Each phase prints its time, and the end the time from `make demo` to the first embedding answered
# through the pool's Service (DEMO_STARTED_MS, set by make; else this script's start).
#
# Needs root (the real node: containerd, iptables, a veth). Cleans up when done; DEMO_KEEP=1 leaves
# everything running (then `make demo-down`, which stops only the processes this script recorded,
# and the cluster). Logs stay in target/demo-logs/ after the run.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
cd "$REPO"
export TEIFLEET_CACHE="${TEIFLEET_CACHE:-$HOME/.cache/teifleet}"
export TEIFLEET_CLUSTER_DIR="${TEIFLEET_CLUSTER_DIR:-$REPO/.cluster}"
export KUBECONFIG="$TEIFLEET_CLUSTER_DIR/kubeconfig"
# The cached Kubernetes tools, called by path: with their directory first in PATH, the scripts'
# `command -v etcd` would find the cache's own link to etcd and point it at itself.
kubectl() { "$TEIFLEET_CACHE/current/kubectl" "$@"; }
helm() { "$TEIFLEET_CACHE/current/helm" "$@"; }
export TEIFLEET_REAL_NODE=1
# The cluster's ports (tests/cluster/up.sh reads the same variables), checked before it starts.
export TEIFLEET_ETCD_PORT="${TEIFLEET_ETCD_PORT:-12379}" TEIFLEET_API_PORT="${TEIFLEET_API_PORT:-16443}"
# The real node's name, taint and GPU count.
DIR="$TEIFLEET_CLUSTER_DIR"
# shellcheck source=tests/cluster/real-node.sh
source "$HERE/cluster/real-node.sh"

SYSTEM_NS=teifleet-system
NS=teifleet-demo
SAMPLE=deploy/samples/bge-small-l4.yaml
POOL="$(awk '$1 == "name:" {print $2; exit}' "$SAMPLE")"
# teifleet-load only calls loopback addresses; this relay carries its connections to the pool's
# ClusterIP, one connection to the Service per client connection, so kube-proxy balances them.
RELAY_PORT="${DEMO_RELAY_PORT:-50051}"
# The burst: more than the sample's budget (64 in flight + 256 queued), less than the raised one.
BURST=600 RAISED_IN_FLIGHT=512 RAISED_QUEUED=2048
# Outside the cluster directory, which cluster-down removes: the logs outlive the run.
RUN="$REPO/target/demo-logs"
PIDS_FILE="$RUN/pids"
IMAGES=target/images
BIN="$REPO/target/debug"

now_ms() { date +%s%3N; }
STARTED_MS="${DEMO_STARTED_MS:-$(now_ms)}"
seconds() { awk -v ms="$1" 'BEGIN { printf "%.1f s", ms / 1000 }'; }
# Each phase's name and time, in order, and the time to the first embedding answered.
phase_names=() phase_took=() phase_name="" phase_started=0 FIRST_ANSWER_MS=""
end_phase() {
  [[ -n "$phase_name" ]] || return 0
  local took=$(($(now_ms) - phase_started))
  phase_names+=("$phase_name") phase_took+=("$took")
  printf '\033[2m   (%s took %s)\033[0m\n' "${phase_name%% *}" "$(seconds "$took")"
  phase_name=""
}
timings() {
  end_phase
  ((${#phase_names[@]})) || return 0
  echo "  time per phase:"
  local i
  for i in "${!phase_names[@]}"; do
    printf '    %-64.64s %9s\n' "${phase_names[$i]}" "$(seconds "${phase_took[$i]}")"
  done
  printf '    %-64s %9s\n' "total, from make demo" "$(seconds $(($(now_ms) - STARTED_MS)))"
  if [[ -n "$FIRST_ANSWER_MS" ]]; then
    printf '    %-64s %9s\n' "first embedding answered through the pool's Service" "$(seconds "$FIRST_ANSWER_MS")"
  fi
}
heading() {
  end_phase
  printf '\n\033[1;36m== %s\033[0m\n' "$1"; [[ $# -gt 1 ]] && printf '\033[2m   look at: %s\033[0m\n' "$2"
  [[ "$1" == Summary ]] || phase_name="$1" phase_started=$(now_ms)
  return 0
}
show() { printf '\033[2m$ %s\033[0m\n' "$*"; "$@"; }

# Pod logs and the cluster's own logs, copied out of the cluster before it goes.
save_logs() {
  kubectl get --raw /readyz >/dev/null 2>&1 || return 0
  local ns pod
  for ns in "$SYSTEM_NS" "$NS"; do
    for pod in $(kubectl get pods -n "$ns" -o name 2>/dev/null); do
      kubectl logs -n "$ns" "$pod" --all-containers --prefix >"$RUN/${pod#pod/}.log" 2>&1 || true
    done
  done
  [[ -d "$TEIFLEET_CLUSTER_DIR/logs" ]] && rm -rf "$RUN/cluster" && cp -r "$TEIFLEET_CLUSTER_DIR/logs" "$RUN/cluster"
  return 0
}

pids=()
SUMMARY_SHOWN=0
cleanup() {
  # A run cut short still says how long each phase it reached took.
  ((SUMMARY_SHOWN)) || timings
  save_logs
  if [[ "${DEMO_KEEP:-}" == 1 ]]; then
    echo "(kept running: export KUBECONFIG=$KUBECONFIG; make demo-down stops it)"
    return
  fi
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -f "$PIDS_FILE"
  tests/cluster/down.sh >/dev/null 2>&1 || true
  echo "(cleaned up; logs in $RUN; DEMO_KEEP=1 keeps the cluster and processes)"
}

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

# A TCP relay: arguments listen-port host port; bytes pass untouched.
RELAY_PY='
import asyncio, sys

async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()

async def serve(client_reader, client_writer):
    try:
        upstream_reader, upstream_writer = await asyncio.open_connection(sys.argv[2], int(sys.argv[3]))
    except OSError as error:
        print("cannot reach", sys.argv[2], error, flush=True)
        client_writer.close()
        return
    await asyncio.gather(pipe(client_reader, upstream_writer), pipe(upstream_reader, client_writer), return_exceptions=True)

async def main():
    server = await asyncio.start_server(serve, "127.0.0.1", int(sys.argv[1]))
    print("relaying 127.0.0.1:%s to %s:%s" % tuple(sys.argv[1:4]), flush=True)
    async with server:
        await server.serve_forever()

asyncio.run(main())
'

pool_pods() { kubectl get pods -n "$NS" -l "$(kubectl get epool "$POOL" -n "$NS" -o jsonpath='{.status.selector}')" "$@"; }

# "<pod> <pod IP> <admin port>" for each of the pool's Running pods.
sidecars() {
  pool_pods --field-selector status.phase=Running -o jsonpath='{range .items[*]}{.metadata.name} {.status.podIP} {.spec.containers[?(@.name=="multiplexer")].ports[?(@.name=="admin")].containerPort}{"\n"}{end}'
}

sidecar_metrics() { curl -sf "http://$1:$2/metrics"; }

sidecar_limit() { # ip admin-port
  sidecar_metrics "$1" "$2" | awk -v s="teifleet_limit_in_flight{pool=\"$POOL\"}" '$1 == s {print $2}'
}

# Each sidecar's answers by outcome, and its limits.
sidecar_report() {
  local pod ip port
  while read -r pod ip port; do
    sidecar_metrics "$ip" "$port" | awk -v pod="$pod" '
      /^teifleet_requests_total\{/ { match($0, /outcome="[^"]*"/); n[substr($0, RSTART + 9, RLENGTH - 10)] += $2 }
      /^teifleet_limit_(in_flight|queued)\{/ { split($1, name, "{"); limits = limits " " name[1] "=" $2 }
      END { printf "  %s:", pod; for (o in n) printf " %s=%d", o, n[o]; print ";" limits }'
  done < <(sidecars)
}

restarts() { pool_pods -o jsonpath='{range .items[*]}{.metadata.name} restarts={range .status.containerStatuses[*]}{.name}:{.restartCount} {end}{"\n"}{end}'; }

pool_conditions() {
  kubectl get epool "$POOL" -n "$NS" -o jsonpath='{range .status.conditions[*]}  {.type}={.status} ({.reason}): {.message}{"\n"}{end}'
}

heading "1/11  Building: the images (make images, from the plain release build) and the demo's tools" \
  "sizes and digests of the operator, multiplexer, tei-sim and job images, built without a Docker engine"
mkdir -p "$RUN"
# Before minutes of building: what would stop the real node from starting (up.sh checks again).
[[ "$(id -u)" == 0 ]] || { echo "make demo needs root for the real node (containerd, iptables, a veth)" >&2; exit 1; }
if [[ -f "$REAL_NODE_LOCK" ]]; then
  owner="$(cat "$REAL_NODE_LOCK")"
  if [[ "$owner" != "$DIR" && -d "$owner/node" ]]; then
    echo "another cluster ($owner) runs the real node on this machine; stop it first (TEIFLEET_CLUSTER_DIR=$owner tests/cluster/down.sh)" >&2
    exit 1
  fi
fi
require_free_port "$RELAY_PORT" "the demo's relay to the pool Service"
require_free_port "$TEIFLEET_ETCD_PORT" "etcd"
require_free_port "$((TEIFLEET_ETCD_PORT + 1))" "etcd's peer port"
require_free_port "$TEIFLEET_API_PORT" "kube-apiserver"
: >"$PIDS_FILE"
trap cleanup EXIT
PYTHON="$(python3 -c 'import sys; print(sys.executable)')"
echo "   (the first run on a machine builds Kubernetes, kwok and helm from source: about 10 minutes, and the"
echo "    release binaries: a few more; progress below; later runs start in seconds)"
step_started=$(now_ms)
tests/cluster/prereqs.sh
step() { echo "   ($1: $(seconds $(($(now_ms) - step_started))))"; step_started=$(now_ms); }
step "prerequisites"
# Plain release binaries: the profile-guided multiplexer (tools/pgo.sh, about 11 minutes on 2 cores)
# only when a build of it from the same code is already there, or with DEMO_IMAGES_PGO=1.
make --no-print-directory images IMAGES_PGO="${DEMO_IMAGES_PGO:-cached}"
step "release build and images"
cargo build --locked -p teifleet-load -p teifleet-fake-gpu-plugin --bins
step "the demo's tools (debug build)"

heading "2/11  A real control plane, fake GPU nodes, and one real node" \
  "kwok's L4 and H100 nodes advertise nvidia.com/gpu; $REAL_NODE_NAME is a real kubelet with $REAL_NODE_GPUS fake L4 GPUs"
tests/cluster/down.sh >/dev/null 2>&1 || true
TEIFLEET_FAKE_GPU_PLUGIN_BIN="$BIN/teifleet-fake-gpu-plugin" tests/cluster/up.sh
echo "   no registry is reachable: the built images go into $REAL_NODE_NAME's containerd"
image_archives=()
while read -r name _; do image_archives+=("$IMAGES/$name.tar"); done <"$IMAGES/images.txt"
tests/cluster/import-images.sh "${image_archives[@]}"
image_ref() { awk -v name="$1" '$1 == name {print $2}' "$IMAGES/images.txt"; }

heading "3/11  helm install teifleet: the operator as a pod on $REAL_NODE_NAME" \
  "the chart's image and ServiceAccount, in a namespace enforcing the restricted Pod Security Standard"
on_real_node=(--set-json "nodeSelector={\"kubernetes.io/hostname\":\"$REAL_NODE_NAME\"}"
  --set-json "tolerations=[{\"key\":\"$REAL_NODE_TAINT_KEY\",\"operator\":\"Exists\",\"effect\":\"NoSchedule\"}]")
for ns in "$SYSTEM_NS" "$NS"; do
  kubectl create namespace "$ns" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  kubectl label namespace "$ns" pod-security.kubernetes.io/enforce=restricted --overwrite >/dev/null
done
show helm install teifleet charts/teifleet -n "$SYSTEM_NS" "${on_real_node[@]}" --wait --timeout 120s
show kubectl get pods -n "$SYSTEM_NS" -o wide
kubectl get pods -n "$SYSTEM_NS" -o jsonpath='{range .items[*]}  {.metadata.name}: image {.spec.containers[0].image}, serviceAccount {.spec.serviceAccountName}{"\n"}{end}'

heading "4/11  kubectl apply $SAMPLE, with TEI swapped for the simulator's image" \
  "its L4 replicas on $REAL_NODE_NAME's GPUs; the pool's budget split into per-replica shares"
# What the demo changes in the sample: TEI's image, pods pinned to the real node, requests small
# enough for this machine (the L4 default asks 2 CPUs per pod).
overrides="$(cat <<JSON
{"spec": {
  "tei": {"image": "$(image_ref tei-sim)", "extraArgs": ["--fixed-latency=20ms", "--per-token-latency=50us"]},
  "template": {
    "nodeSelector": {"kubernetes.io/hostname": "$REAL_NODE_NAME"},
    "tolerations": [{"key": "$REAL_NODE_TAINT_KEY", "operator": "Exists", "effect": "NoSchedule"}],
    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}}}
JSON
)"
echo "$overrides"
kubectl patch --local -f "$SAMPLE" --type merge -p "$overrides" -o yaml | kubectl apply -n "$NS" -f -
kubectl wait -n "$NS" --for=condition=Ready "embeddingpool/$POOL" --timeout=120s >/dev/null
show kubectl get epool -n "$NS"
show kubectl get pods -n "$NS" -o wide
pool_conditions
echo "  shares: $(kubectl get epool "$POOL" -n "$NS" -o jsonpath='{.status.admission}')"
while read -r pod ip port; do
  for _ in $(seq 100); do [[ -n "$(sidecar_limit "$ip" "$port")" ]] && break; sleep 0.1; done
  echo "  $pod: its sidecar enforces the share it read with its own ServiceAccount: $(sidecar_limit "$ip" "$port") in flight"
done < <(sidecars)

heading "5/11  Stock tei.v1 gRPC calls through the pool's ClusterIP Service (kube-proxy)" \
  "teifleet-load, the project's gRPC load generator, through a loopback relay to the ClusterIP"
show kubectl get service "$POOL" -n "$NS"
CLUSTER_IP="$(kubectl get service "$POOL" -n "$NS" -o jsonpath='{.spec.clusterIP}')"
GRPC_PORT="$(kubectl get service "$POOL" -n "$NS" -o jsonpath='{.spec.ports[?(@.name=="grpc")].port}')"
HTTP_PORT="$(kubectl get service "$POOL" -n "$NS" -o jsonpath='{.spec.ports[?(@.name=="http")].port}')"
start relay "$PYTHON" -c "$RELAY_PY" "$RELAY_PORT" "$CLUSTER_IP" "$GRPC_PORT"
for _ in $(seq 50); do (exec 3<>"/dev/tcp/127.0.0.1/$RELAY_PORT") 2>/dev/null && break; sleep 0.1; done
TARGET="http://127.0.0.1:$RELAY_PORT"
echo "  the first embedding (tei.v1.Embed) through the Service, retried until kube-proxy routes it:"
for attempt in $(seq 60); do
  rm -f "$RUN/first.json"
  "$BIN/teifleet-load" --quiet --target "$TARGET" --requests 1 --deadline 10s --json "$RUN/first.json" >>"$RUN/first.log" 2>&1 || true
  [[ "$("$PYTHON" -c 'import json,sys; print(json.load(open(sys.argv[1]))["ok"])' "$RUN/first.json" 2>/dev/null)" == 1 ]] && break
  ((attempt < 60)) || { echo "no embedding answered through $CLUSTER_IP:$GRPC_PORT in 60 tries ($RUN/first.log)" >&2; exit 1; }
  sleep 1
done
FIRST_ANSWER_MS=$(($(now_ms) - STARTED_MS))
echo "  answered $(seconds "$FIRST_ANSWER_MS") after make demo started (attempt $attempt)"
show "$BIN/teifleet-load" --target "$TARGET" --rpc info --requests 1
show "$BIN/teifleet-load" --target "$TARGET" --mode closed --concurrency 4 --requests 40 --connections 4

heading "6/11  TEI's HTTP API and OpenAI's embeddings route, on the Service's http port" \
  "curl to $CLUSTER_IP:$HTTP_PORT: the sidecar translates to tei.v1 under the same admission"
show curl -sS --fail-with-body "http://$CLUSTER_IP:$HTTP_PORT/embed" -H 'content-type: application/json' \
  -d '{"inputs": ["teifleet puts the queue where it belongs", "and answers overload at once"]}' -o "$RUN/embed.json"
"$PYTHON" -c 'import json,sys; r=json.load(open(sys.argv[1])); print("  /embed:", len(r), "embeddings of", len(r[0]), "floats")' "$RUN/embed.json"
show curl -sS --fail-with-body "http://$CLUSTER_IP:$HTTP_PORT/v1/embeddings" -H 'content-type: application/json' \
  -d "{\"model\": \"$(kubectl get epool "$POOL" -n "$NS" -o jsonpath='{.spec.model.id}')\", \"input\": \"teifleet\"}" -o "$RUN/openai.json"
"$PYTHON" -c 'import json,sys; r=json.load(open(sys.argv[1])); print("  /v1/embeddings:", r["object"], "of", len(r["data"]), "embedding of", len(r["data"][0]["embedding"]), "floats; model", r["model"], "; usage", r["usage"])' "$RUN/openai.json"

budget() { kubectl get epool "$POOL" -n "$NS" -o jsonpath="{.spec.concurrency.maxInFlight} in flight + {.spec.concurrency.maxQueued} queued"; }
heading "7/11  A burst of $BURST concurrent calls with a 5 s deadline: more than the pool's budget ($(budget))" \
  "RESOURCE_EXHAUSTED answered at once for the overflow, the rest served; TEI never flooded (calls without a deadline would wait their turn at the pool's door instead)"
show "$BIN/teifleet-load" --target "$TARGET" --mode closed --concurrency "$BURST" --requests "$BURST" --tokens 16 --connections 4 --deadline 5s
sidecar_report

heading "8/11  kubectl patch spec.concurrency up ($RAISED_IN_FLIGHT in flight / $RAISED_QUEUED queued), live" \
  "each sidecar's limit changes within a second, restartCount stays 0; the same burst is now admitted"
restarts_before="$(restarts)"
start_ms=$(date +%s%3N)
show kubectl patch epool "$POOL" -n "$NS" --type merge \
  -p "{\"spec\":{\"concurrency\":{\"maxInFlight\":$RAISED_IN_FLIGHT,\"maxQueued\":$RAISED_QUEUED}}}"
replicas="$(kubectl get epool "$POOL" -n "$NS" -o jsonpath='{.spec.replicas}')"
raised_share=$(( (RAISED_IN_FLIGHT + replicas - 1) / replicas ))
while read -r pod ip port; do
  for _ in $(seq 100); do [[ "$(sidecar_limit "$ip" "$port")" == "$raised_share" ]] && break; sleep 0.05; done
  echo "  $pod: in-flight limit $(sidecar_limit "$ip" "$port"), $(( $(date +%s%3N) - start_ms )) ms after the patch"
done < <(sidecars)
show "$BIN/teifleet-load" --target "$TARGET" --mode closed --concurrency "$BURST" --requests "$BURST" --tokens 16 --connections 4 --deadline 5s
show kubectl get pods -n "$NS" -o wide
if [[ "$(restarts)" == "$restarts_before" ]]; then
  echo "  same pods, restart counts unchanged:"
  restarts | sed 's/^/    /'
else
  echo "  pods changed after the patch!" >&2; echo "$restarts_before" >&2; restarts >&2; exit 1
fi

JOB=corpus JOB_ROWS="${DEMO_JOB_ROWS:-6000}"
JOB_DIR="$RUN/job"
job_state() { kubectl get embeddingjob "$JOB" -n "$NS" -o jsonpath='{.status.conditions[?(@.status=="True")].type}'; }
heading "9/11  An EmbeddingJob: $JOB_ROWS generated rows, JSONL on a claim, through the pool into Parquet" \
  "kubectl get embeddingjob -w: rows done of the total, a 64Ki shard at a time, until Complete; the workers' calls take the pool's ingest lane"
# The claims are hostPath volumes on $REAL_NODE_NAME, whose kubelet runs on this machine: the corpus is
# written here and the vectors read back here. A worker skips shards whose output exists: start empty.
rm -rf "$JOB_DIR"
mkdir -p "$JOB_DIR/in" "$JOB_DIR/out"
awk -v n="$JOB_ROWS" 'BEGIN { for (i = 0; i < n; i++)
  printf "{\"id\": \"doc-%d\", \"text\": \"document %d of the demo corpus, about topic %d\"}\n", i, i, i % 97 }' \
  >"$JOB_DIR/in/corpus.jsonl"
# The workers run as the job image's non-root user.
chmod -R a+rwX "$JOB_DIR"
echo "  corpus: $JOB_DIR/in/corpus.jsonl, $JOB_ROWS rows, $(du -k "$JOB_DIR/in/corpus.jsonl" | cut -f1) KiB; first line:"
echo "    $(head -n 1 "$JOB_DIR/in/corpus.jsonl")"
claim_yaml() { # claim host-dir
  cat <<YAML
apiVersion: v1
kind: PersistentVolume
metadata: {name: $NS-$1}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: ""
  hostPath: {path: $2, type: Directory}
  claimRef: {namespace: $NS, name: $1}
  nodeAffinity:
    required:
      nodeSelectorTerms: [{matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [$REAL_NODE_NAME]}]}]
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: $1, namespace: $NS}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: ""
  volumeName: $NS-$1
  resources: {requests: {storage: 1Gi}}
YAML
}
{ claim_yaml corpus "$JOB_DIR/in"; echo ---; claim_yaml vectors "$JOB_DIR/out"; } | kubectl apply -f - >/dev/null
# Small calls, so that each shard takes a few seconds against the simulator's 20 ms a call: the
# operator reads the workers' reports once they pause for a second, so a job whose shards all finish
# within a second of each other would go from 0 to done in one line.
cat <<YAML | tee "$RUN/$JOB.yaml"
apiVersion: teifleet.dev/v1alpha1
kind: EmbeddingJob
metadata: {name: $JOB}
spec:
  poolRef: {name: $POOL}
  input: {store: {pvc: {claimName: corpus}}, format: jsonl}
  output: {store: {pvc: {claimName: vectors}}}
  workers: 2
  shardBytes: 64Ki
  rowsPerCall: 8
  template:
    nodeSelector: {kubernetes.io/hostname: $REAL_NODE_NAME}
    tolerations: [{key: $REAL_NODE_TAINT_KEY, operator: Exists, effect: NoSchedule}]
    resources: {requests: {cpu: 100m, memory: 64Mi}}
YAML
job_started=$(now_ms)
kubectl apply -n "$NS" -f "$RUN/$JOB.yaml" >/dev/null
printf '\033[2m$ kubectl get embeddingjob %s -n %s -w\033[0m   (each line stamped with the time it came)\n' "$JOB" "$NS"
# The binary itself, not the kubectl function, so that $! is kubectl's own PID.
"$TEIFLEET_CACHE/current/kubectl" get embeddingjob "$JOB" -n "$NS" -w \
  > >(while IFS= read -r line; do printf '  %s  %s\n' "$(date +%T)" "$line"; done) 2>&1 &
watch_pid=$!
pids+=("$watch_pid")
for _ in $(seq 600); do
  state=" $(job_state) "
  [[ "$state" == *" Complete "* || "$state" == *" Failed "* ]] && break
  sleep 0.5
done
sleep 1 # the watch's last line
kill "$watch_pid" 2>/dev/null || true
wait "$watch_pid" 2>/dev/null || true
echo "  the job's final status ($(seconds $(($(now_ms) - job_started))) after kubectl apply):"
kubectl get embeddingjob "$JOB" -n "$NS" -o json | "$PYTHON" -c '
import json, sys
status = json.load(sys.stdin).get("status", {})
conditions = status.pop("conditions", [])
for key in sorted(status):
    print("    %s: %s" % (key, status[key]))
for c in conditions:
    print("    condition %s=%s (%s): %s" % (c["type"], c["status"], c.get("reason"), c.get("message", "")))'
kubectl get events -n "$NS" --field-selector involvedObject.kind=EmbeddingJob --sort-by=.lastTimestamp | tail -n 4
[[ " $(job_state) " == *" Complete "* ]] || { echo "the job did not complete (logs: $RUN after the run)" >&2; exit 1; }
parts=("$JOB_DIR"/out/part-*.parquet)
echo "  $JOB_DIR/out: ${#parts[@]} Parquet parts, $(du -sk "$JOB_DIR/out" | cut -f1) KiB: one row per input row, its vector or its error"
# With pyarrow at hand (make test-clients installs it in target/py-venv), the rows read back.
if [[ -x target/py-venv/bin/python ]] && target/py-venv/bin/python -c 'import pyarrow' 2>/dev/null; then
  target/py-venv/bin/python -c '
import sys, pyarrow.dataset as ds
t = ds.dataset(sys.argv[1], format="parquet").to_table()
ids = t["id"].to_pylist()
ok = t.filter(t["error"].is_null())
dim = t.schema.field("embedding").type.list_size
print("  read back with pyarrow: %d rows, %d distinct ids of %s, %d with a %d-float vector, %d with an error"
      % (len(t), len(set(ids)), sys.argv[2], len(ok), dim, len(t) - len(ok)))' "$JOB_DIR/out" "$JOB_ROWS"
fi

heading "10/11  Over-asking for GPUs: $((REAL_NODE_GPUS + 1)) replicas on $REAL_NODE_NAME's $REAL_NODE_GPUS GPUs" \
  "Ready=False, reason InsufficientGPU, naming the GPU type; the running replicas keep serving"
show kubectl scale epool "$POOL" -n "$NS" --replicas=$((REAL_NODE_GPUS + 1))
kubectl wait -n "$NS" --for=jsonpath='{.status.conditions[?(@.type=="Ready")].reason}'=InsufficientGPU \
  "embeddingpool/$POOL" --timeout=60s >/dev/null
show kubectl get epool -n "$NS"
show kubectl get pods -n "$NS" -o wide
pool_conditions
kubectl get events -n "$NS" --field-selector involvedObject.kind=EmbeddingPool | tail -n 4
show "$BIN/teifleet-load" --target "$TARGET" --mode closed --concurrency 4 --requests 40 --connections 4

SCALED=elastic
SCALED_RELAY_PORT="${DEMO_SCALED_RELAY_PORT:-50052}"
require_free_port "$SCALED_RELAY_PORT" "the relay to the autoscaled pool"
scaled_state() {
  kubectl get epool "$SCALED" -n "$NS" -o jsonpath='{.status.autoscaling.desiredReplicas} desired, {.status.readyReplicas} ready: {.status.autoscaling.message}'
}
heading "11/11  A pool that sizes itself: spec.autoscaling from zero, up under a burst, back to zero" \
  "the activator holds the first call while a replica starts; 200 ms batches of 4 make each replica serve ~10 calls/s"
cat <<YAML | tee "$RUN/$SCALED.yaml"
apiVersion: teifleet.dev/v1alpha1
kind: EmbeddingPool
metadata: {name: $SCALED}
spec:
  model: {id: BAAI/bge-small-en-v1.5}
  gpu: {type: cpu}
  tei: {image: "$(image_ref tei-sim)", extraArgs: ["--fixed-latency=200ms"]}
  concurrency: {maxInFlight: 16, maxInFlightPerReplica: 4, maxQueued: 64}
  autoscaling: {minReplicas: 0, maxReplicas: 4, scaleDownStabilization: 20s, scaleToZeroAfter: 20s, coldStartHold: 120s}
  template:
    nodeSelector: {kubernetes.io/hostname: $REAL_NODE_NAME}
    tolerations: [{key: $REAL_NODE_TAINT_KEY, operator: Exists, effect: NoSchedule}]
    resources: {requests: {cpu: 50m, memory: 32Mi}}
YAML
kubectl apply -n "$NS" -f "$RUN/$SCALED.yaml" >/dev/null
kubectl wait -n "$NS" --for=jsonpath='{.status.autoscaling.desiredReplicas}'=0 "embeddingpool/$SCALED" --timeout=120s >/dev/null
kubectl wait -n "$NS" --for=condition=Available deployment/teifleet-activator --timeout=120s >/dev/null
show kubectl get epool "$SCALED" -n "$NS"
show kubectl get pods -n "$NS" -l app.kubernetes.io/component=activator -o wide
SCALED_IP="$(kubectl get service "$SCALED" -n "$NS" -o jsonpath='{.spec.clusterIP}')"
# A new pool's activator is seconds old: wait until kube-proxy sends its Service somewhere.
for _ in $(seq 300); do (exec 3<>"/dev/tcp/$SCALED_IP/$GRPC_PORT") 2>/dev/null && break; sleep 0.2; done
start relay-scaled "$PYTHON" -c "$RELAY_PY" "$SCALED_RELAY_PORT" "$SCALED_IP" "$GRPC_PORT"
for _ in $(seq 50); do (exec 3<>"/dev/tcp/127.0.0.1/$SCALED_RELAY_PORT") 2>/dev/null && break; sleep 0.1; done
SCALED_TARGET="http://127.0.0.1:$SCALED_RELAY_PORT"
echo "  the first call, at zero replicas (the relay dials by address, so it names its pool):"
show "$BIN/teifleet-load" --target "$SCALED_TARGET" --pool "$SCALED" --rpc info --requests 1 --deadline 120s
echo "  a burst of 30 calls/s for 50 s, about 3 replicas' worth; the autoscaler's view every 5 s:"
start burst "$BIN/teifleet-load" --target "$SCALED_TARGET" --pool "$SCALED" --rate 30 --duration 50s --requests 100000 --tokens 16 --connections 8
burst_pid=${pids[-1]}
for _ in $(seq 10); do sleep 5; echo "  $(date +%T)  $(scaled_state)"; done
wait "$burst_pid" || true
tail -n 14 "$RUN/burst.log"
echo "  load gone; back to zero after scaleDownStabilization and scaleToZeroAfter (20 s each):"
for _ in $(seq 40); do
  sleep 5; echo "  $(date +%T)  $(scaled_state)"
  [[ "$(kubectl get epool "$SCALED" -n "$NS" -o jsonpath='{.status.autoscaling.desiredReplicas}/{.status.readyReplicas}')" == "0/0" ]] && break
done
kubectl get events -n "$NS" --field-selector "involvedObject.name=$SCALED" --sort-by=.lastTimestamp | tail -n 8

heading "Summary"
cat <<SUMMARY
  - make images built the four images (no profile-guided build to wait for); they ran from
    $REAL_NODE_NAME's containerd
  - helm installed the CRD and the operator, which ran as a pod on the chart's ServiceAccount
  - the sample pool became TEI pods Running on the real kubelet, probed Ready, fake L4 GPUs allocated
  - stock gRPC and HTTP calls went through the pool's ClusterIP Service and its multiplexer sidecars
  - a burst beyond the budget was shed at once with RESOURCE_EXHAUSTED instead of queueing in TEI
  - a live spec.concurrency edit reached every sidecar in under a second; no container restarted
  - an EmbeddingJob sent $JOB_ROWS rows from a claim through the pool's ingest lane and wrote one
    Parquet row per input row to another claim, its progress in its status until Complete
  - asking for more GPUs than the node has reported InsufficientGPU, and the pool kept serving
  - an autoscaled pool started at zero, held its first call while a replica started, grew under a
    burst and went back to zero when the burst ended
  logs: $RUN/
SUMMARY
SUMMARY_SHOWN=1
timings
