#!/usr/bin/env bash
# Starts a real Kubernetes control plane on 127.0.0.1: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler and kwok, which plays the kubelet for fake nodes that
# advertise nvidia.com/gpu capacity and GPU Feature Discovery product labels.
# With TEIFLEET_REAL_NODE=1 (make cluster-up, make test-cluster) it also starts one real node,
# real-0: a kubelet and kube-proxy on containerd with fake GPUs from a device plugin
# (tests/cluster/real-node.sh); the API server then listens on that node's address instead.
#
# Usage: tests/cluster/up.sh        (state, logs and kubeconfig land in $TEIFLEET_CLUSTER_DIR)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
DIR="${TEIFLEET_CLUSTER_DIR:-$REPO/.cluster}"
CACHE="${TEIFLEET_CACHE:-$HOME/.cache/teifleet}"
ETCD_PORT="${TEIFLEET_ETCD_PORT:-12379}"
API_PORT="${TEIFLEET_API_PORT:-16443}"

log() { echo "[cluster-up] $*" >&2; }

if [[ -f "$DIR/kubeconfig" ]] && "$CACHE/current/kubectl" --kubeconfig "$DIR/kubeconfig" get --raw /readyz >/dev/null 2>&1; then
  log "already running; KUBECONFIG=$DIR/kubeconfig"
  exit 0
fi
"$HERE/down.sh" >/dev/null 2>&1 || true

"$HERE/install-binaries.sh"
BIN="$CACHE/current"
export PATH="$BIN:$PATH"
mkdir -p "$DIR"/{pki,logs,pids,etcd}
# shellcheck source-path=SCRIPTDIR source=real-node.sh
source "$HERE/real-node.sh"
API_HOST=127.0.0.1
SANS="IP:127.0.0.1"
if real_node_wanted; then
  API_HOST="$REAL_NODE_IP"
  SANS+=", IP:$REAL_NODE_IP"
fi

# Another cluster on these ports (another checkout's, or one this directory lost track of) would be
# joined silently: the health checks below cannot tell whose etcd or API server answers.
# Only loopback is probed: the real node's address does not exist yet (another cluster holding the
# real node is caught by its lock), and a connection to an address that is not local may be
# answered by whatever the machine's network routes it to.
for address in "127.0.0.1:$ETCD_PORT" "127.0.0.1:$((ETCD_PORT + 1))" "127.0.0.1:$API_PORT"; do
  if (exec 3<>"/dev/tcp/${address%:*}/${address##*:}") 2>/dev/null; then
    log "$address is already in use: another cluster runs here (ss -ltnp 'sport = :${address##*:}');"
    log "stop it, or give this one other ports with TEIFLEET_ETCD_PORT and TEIFLEET_API_PORT"
    exit 1
  fi
done

# --- certificates: a CA, the API server's serving cert, an admin client, service-account keys ---
PKI="$DIR/pki"
(
  cd "$PKI"
  openssl genrsa -out ca.key 2048 2>/dev/null
  openssl req -x509 -new -key ca.key -subj "/CN=teifleet-local-ca" -days 3650 -out ca.crt 2>/dev/null
  cat > apiserver.ext <<EXT
subjectAltName = $SANS, DNS:localhost, DNS:kubernetes, DNS:kubernetes.default, DNS:kubernetes.default.svc, DNS:kubernetes.default.svc.cluster.local, IP:10.96.0.1
extendedKeyUsage = serverAuth
EXT
  openssl genrsa -out apiserver.key 2048 2>/dev/null
  openssl req -new -key apiserver.key -subj "/CN=kube-apiserver" -out apiserver.csr 2>/dev/null
  openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
    -extfile apiserver.ext -out apiserver.crt 2>/dev/null
  printf 'extendedKeyUsage = clientAuth\n' > client.ext
  openssl genrsa -out admin.key 2048 2>/dev/null
  openssl req -new -key admin.key -subj "/CN=teifleet-admin/O=system:masters" -out admin.csr 2>/dev/null
  openssl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
    -extfile client.ext -out admin.crt 2>/dev/null
  openssl genrsa -out sa.key 2048 2>/dev/null
  openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
)

if real_node_wanted; then real_node_prepare; fi

KUBECONFIG_FILE="$DIR/kubeconfig"
cat > "$KUBECONFIG_FILE" <<EOF2
apiVersion: v1
kind: Config
clusters:
- name: teifleet-local
  cluster:
    server: https://$API_HOST:$API_PORT
    certificate-authority: $PKI/ca.crt
users:
- name: teifleet-admin
  user:
    client-certificate: $PKI/admin.crt
    client-key: $PKI/admin.key
contexts:
- name: teifleet-local
  context: {cluster: teifleet-local, user: teifleet-admin, namespace: default}
current-context: teifleet-local
EOF2

start() { # name command...
  local name="$1"; shift
  setsid nohup "$@" >"$DIR/logs/$name.log" 2>&1 < /dev/null &
  echo $! > "$DIR/pids/$name.pid"
}

wait_for() { # description seconds command...
  local what="$1" seconds="$2"; shift 2
  for _ in $(seq "$((seconds * 2))"); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  log "timed out waiting for $what; logs in $DIR/logs"
  tail -n 30 "$DIR"/logs/*.log >&2 || true
  exit 1
}

log "starting etcd on 127.0.0.1:$ETCD_PORT"
start etcd etcd --name teifleet --data-dir "$DIR/etcd" \
  --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
  --initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
  --initial-cluster "teifleet=http://127.0.0.1:$((ETCD_PORT + 1))"
wait_for etcd 30 curl -sf "http://127.0.0.1:$ETCD_PORT/health"

# Without a real node no pod runs anywhere, so the `kubernetes` Service needs no endpoints; with
# one, the API server serves on the node's address and keeps them there.
if real_node_wanted; then
  # shellcheck disable=SC2207
  api_address_flags=($(real_node_apiserver_flags))
else
  api_address_flags=(--bind-address 127.0.0.1 --advertise-address 127.0.0.1 --authorization-mode RBAC
    --endpoint-reconciler-type none)
fi
log "starting kube-apiserver on $API_HOST:$API_PORT"
start kube-apiserver kube-apiserver \
  --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
  "${api_address_flags[@]}" --secure-port "$API_PORT" \
  --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
  --client-ca-file "$PKI/ca.crt" \
  --service-account-issuer https://kubernetes.default.svc.cluster.local \
  --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
  --service-cluster-ip-range 10.96.0.0/16 \
  --enable-priority-and-fairness=false \
  --profiling=false
wait_for kube-apiserver 90 kubectl --kubeconfig "$KUBECONFIG_FILE" get --raw /readyz

log "starting kube-controller-manager, kube-scheduler and kwok"
start kube-controller-manager kube-controller-manager \
  --kubeconfig "$KUBECONFIG_FILE" --authentication-kubeconfig "$KUBECONFIG_FILE" --authorization-kubeconfig "$KUBECONFIG_FILE" \
  --leader-elect=false --bind-address 127.0.0.1 --secure-port 0 \
  --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
  --use-service-account-credentials=false \
  --node-monitor-grace-period 40s \
  --concurrent-gc-syncs 5
start kube-scheduler kube-scheduler \
  --kubeconfig "$KUBECONFIG_FILE" --authentication-kubeconfig "$KUBECONFIG_FILE" --authorization-kubeconfig "$KUBECONFIG_FILE" \
  --leader-elect=false --bind-address 127.0.0.1 --secure-port 0
start kwok kwok \
  --kubeconfig "$KUBECONFIG_FILE" \
  --manage-all-nodes=false \
  --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
  --node-lease-duration-seconds=40 \
  --cidr=10.244.0.0/16 --node-ip=10.244.0.1

export KUBECONFIG="$KUBECONFIG_FILE"
wait_for "the default ServiceAccount" 60 kubectl get serviceaccount default -n default
log "registering fake nodes"
kubectl apply -f "$HERE/nodes.yaml" >/dev/null
wait_for "nodes to become Ready" 90 bash -c \
  "kubectl get nodes -o jsonpath='{range .items[*]}{.spec.taints}{\"\\n\"}{end}' | grep -q not-ready && exit 1; kubectl wait --for=condition=Ready nodes --all --timeout=1s"
if real_node_wanted; then real_node_start; fi
kubectl get nodes -L nvidia.com/gpu.product >&2
log "ready: export KUBECONFIG=$KUBECONFIG_FILE"
