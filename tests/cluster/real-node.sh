# shellcheck shell=bash
# The local cluster's one real node, sourced by up.sh and down.sh: a kubelet and kube-proxy
# (v1.33, iptables mode) on containerd and runc, pods on a CNI bridge, and fake GPUs from
# teifleet-fake-gpu-plugin through the kubelet's device-plugin API. Everything it adds to the
# machine is recorded under $DIR/node and removed by real_node_stop:
#
#   network    a veth pair carrying the node's /32 address (the kubelet refuses a loopback node IP,
#              and this kernel has no dummy links); the pods' bridge and their veths
#   processes  containerd, kubelet, kube-proxy, the device plugin (PIDs in $DIR/pids), containerd's
#              shims; the API server listens on the node address too, so pods can reach it
#   iptables   the KUBE-* chains of kube-proxy and the kubelet, CNI-* chains of the CNI plugins
#   sysctls    those the kubelet and the bridge plugin set, restored to their values before
#   paths      /var/lib/kubelet/device-plugins (the kubelet's, whatever its root dir),
#              /var/log/containers, /var/lib/cni, /run/netns, /run/containerd, /run/mount
#              (umount's table): removed when this script created them; the rest is in $DIR/node
#
# One real node per machine: /run/teifleet-real-node names the cluster directory that owns it.
#
# Needs (from up.sh): DIR, PKI, BIN, CACHE, HERE, REPO, API_PORT and the functions log, start,
# wait_for. Settings: TEIFLEET_REAL_NODE_IP (10.251.0.1), TEIFLEET_REAL_NODE_POD_CIDR (a /24,
# 10.252.0.0/24), TEIFLEET_REAL_NODE_GPUS (2), TEIFLEET_REAL_NODE_SHARED_REPLICAS (4),
# TEIFLEET_FAKE_GPU_PLUGIN_BIN (default: cargo build).

REAL_NODE_NAME=real-0
REAL_NODE_IP="${TEIFLEET_REAL_NODE_IP:-10.251.0.1}"
REAL_NODE_POD_CIDR="${TEIFLEET_REAL_NODE_POD_CIDR:-10.252.0.0/24}"
REAL_NODE_POD_GATEWAY="${REAL_NODE_POD_CIDR%.*}.1"
REAL_NODE_GPUS="${TEIFLEET_REAL_NODE_GPUS:-2}"
REAL_NODE_GPU_PRODUCT=NVIDIA-L4
# Beside its whole GPUs the node has one more fake L4 shared by time-slicing, as NVIDIA's plugin
# offers it with renameByDefault: REAL_NODE_SHARED_REPLICAS of nvidia.com/gpu.shared, and GPU
# Feature Discovery's sharing labels. Pools asking for whole GPUs never take a replica.
REAL_NODE_SHARED_REPLICAS="${TEIFLEET_REAL_NODE_SHARED_REPLICAS:-4}"
REAL_NODE_SHARED_RESOURCE=nvidia.com/gpu.shared
# Pods of other tests never land here unless they tolerate this taint.
REAL_NODE_TAINT_KEY=teifleet.dev/real-node
REAL_NODE_VETH=tfnode0
REAL_NODE_VETH_PEER=tfnode1
REAL_NODE_BRIDGE=tfbr0
REAL_NODE_LOCK=/run/teifleet-real-node
REAL_NODE_PLUGIN_DIR=/var/lib/kubelet/device-plugins
PAUSE_IMAGE=teifleet.local/pause:1
ECHO_IMAGE=teifleet.local/echo:1
# Paths outside $DIR that the kubelet, containerd and the CNI plugins write to.
REAL_NODE_HOST_PATHS=(/var/lib/kubelet /var/log/containers /var/lib/cni /run/netns /run/containerd /run/mount)
# Kernel settings the kubelet (protectKernelDefaults: false) or the bridge plugin (isGateway) change.
REAL_NODE_SYSCTLS=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.ipv4.ip_forward net.ipv4.conf.all.route_localnet)

real_node_dir() { echo "$DIR/node"; }

# The real node's switch: on with TEIFLEET_REAL_NODE=1 (make cluster-up and make test-cluster).
real_node_wanted() { [[ "${TEIFLEET_REAL_NODE:-0}" == 1 ]]; }

# Before the control plane starts: checks, the node's address (the API server binds to it) and
# its certificates (the API server's kubelet client among them).
real_node_prepare() {
  local node; node="$(real_node_dir)"
  [[ "$(id -u)" == 0 ]] || { log "the real node needs root (containerd, iptables, veth); set TEIFLEET_REAL_NODE=0 to run without it"; return 1; }
  local tool
  for tool in containerd runc ctr iptables ip gcc; do
    command -v "$tool" >/dev/null 2>&1 || { log "the real node needs $tool: run tests/cluster/install-binaries.sh as root"; return 1; }
  done
  for tool in bridge host-local portmap loopback; do
    [[ -x "/usr/lib/cni/$tool" ]] || { log "the real node needs the CNI plugin /usr/lib/cni/$tool (Debian: containernetworking-plugins)"; return 1; }
  done
  if [[ -f "$REAL_NODE_LOCK" ]]; then
    local owner; owner="$(cat "$REAL_NODE_LOCK")"
    # The lock is stale unless its owner's kubelet or containerd still runs.
    if [[ "$owner" != "$DIR" ]] && { alive kubelet "$owner" || alive containerd "$owner"; }; then
      log "another cluster ($owner) runs the real node on this machine: stop it (TEIFLEET_CLUSTER_DIR=$owner tests/cluster/down.sh) or set TEIFLEET_REAL_NODE=0"
      return 1
    fi
  fi
  if ip link show "$REAL_NODE_VETH" >/dev/null 2>&1 || ip link show "$REAL_NODE_BRIDGE" >/dev/null 2>&1; then
    log "$REAL_NODE_VETH or $REAL_NODE_BRIDGE exists already: a real node not stopped by down.sh? ip link del them first"
    return 1
  fi
  echo "$DIR" >"$REAL_NODE_LOCK"
  mkdir -p "$node"/{cni/net.d,cni/ipam,containerd,kubelet,pod-logs}

  # What to restore: sysctl values, host paths that already exist, iptables tables in use.
  : >"$node/sysctls"
  local key
  for key in "${REAL_NODE_SYSCTLS[@]}"; do
    [[ -e "/proc/sys/${key//.//}" ]] && echo "$key=$(sysctl -n "$key")" >>"$node/sysctls"
  done
  : >"$node/host-paths-before"
  local path
  for path in "${REAL_NODE_HOST_PATHS[@]}"; do
    [[ -e "$path" ]] && echo "$path" >>"$node/host-paths-before"
  done
  { iptables-save 2>/dev/null | sed -n 's/^\*/ip /p'; ip6tables-save 2>/dev/null | sed -n 's/^\*/ip6 /p'; } >"$node/iptables-tables-before"

  log "real node: address $REAL_NODE_IP/32 on veth $REAL_NODE_VETH"
  ip link add "$REAL_NODE_VETH" type veth peer name "$REAL_NODE_VETH_PEER"
  ip addr add "$REAL_NODE_IP/32" dev "$REAL_NODE_VETH"
  ip link set "$REAL_NODE_VETH_PEER" up
  ip link set "$REAL_NODE_VETH" up

  (
    cd "$PKI" || exit 1
    client_cert kubelet "/CN=system:node:$REAL_NODE_NAME/O=system:nodes"
    client_cert kube-proxy "/CN=system:kube-proxy"
    client_cert apiserver-kubelet-client "/CN=kube-apiserver-kubelet-client/O=system:masters"
  )
  node_kubeconfig kubelet >"$node/kubelet.kubeconfig"
  node_kubeconfig kube-proxy >"$node/kube-proxy.kubeconfig"
}

# client_cert NAME SUBJECT: NAME.crt and NAME.key signed by the cluster CA, for client auth.
client_cert() {
  openssl genrsa -out "$1.key" 2048 2>/dev/null
  openssl req -new -key "$1.key" -subj "$2" -out "$1.csr" 2>/dev/null
  openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
    -extfile client.ext -out "$1.crt" 2>/dev/null
}

node_kubeconfig() { # user
  cat <<EOF
apiVersion: v1
kind: Config
clusters:
- name: teifleet-local
  cluster: {server: "https://$REAL_NODE_IP:$API_PORT", certificate-authority: "$PKI/ca.crt"}
users:
- name: $1
  user: {client-certificate: "$PKI/$1.crt", client-key: "$PKI/$1.key"}
contexts:
- name: $1
  context: {cluster: teifleet-local, user: $1}
current-context: $1
EOF
}

# The API server's flags for the real node: its address, the Node authorizer for the kubelet's
# identity, a client certificate to call kubelets (logs, exec), and the `kubernetes` Service's
# endpoints kept on the node address so that pods reach the API server.
real_node_apiserver_flags() {
  echo --bind-address "$REAL_NODE_IP" --advertise-address "$REAL_NODE_IP" \
    --authorization-mode Node,RBAC \
    --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" \
    --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types InternalIP,Hostname
}

ctr_node() { ctr --address "$(real_node_dir)/containerd/containerd.sock" -n k8s.io "$@"; }

# The snapshotter containerd can use under the node's directory: overlayfs where the kernel
# mounts an overlay there, else native (copies instead of layers). An overlay cannot have its
# upper directory on another overlay, so a checkout on an overlay filesystem (a CI runner's, say)
# leaves every pod sandbox failing with "failed to mount rootfs component" under overlayfs.
# TEIFLEET_REAL_NODE_SNAPSHOTTER=native picks native anyway: how to run here what such a runner runs.
real_node_snapshotter() {
  if [[ -n "${TEIFLEET_REAL_NODE_SNAPSHOTTER:-}" ]]; then
    echo "$TEIFLEET_REAL_NODE_SNAPSHOTTER"
    return
  fi
  local probe; probe="$(mktemp -d "$(real_node_dir)/overlay-probe.XXXXXX")"
  mkdir -p "$probe"/{lower,upper,work,merged}
  if mount -t overlay overlay -o "lowerdir=$probe/lower,upperdir=$probe/upper,workdir=$probe/work" "$probe/merged" 2>/dev/null; then
    umount "$probe/merged"
    echo overlayfs
  else
    echo native
  fi
  rm -rf "$probe"
}

# Imports image archives with the snapshotter the node's CRI uses (recorded by real_node_start).
real_node_import() {
  local snapshotter; snapshotter="$(cat "$(real_node_dir)/snapshotter")"
  local tar
  for tar in "$@"; do
    ctr_node images import --snapshotter "$snapshotter" "$tar"
  done
}

# After the control plane: containerd with the local images, the kubelet, kube-proxy and the
# device plugin; waits until the node is Ready with its GPUs.
real_node_start() {
  local node started; node="$(real_node_dir)"; started=$SECONDS
  local plugin="${TEIFLEET_FAKE_GPU_PLUGIN_BIN:-}"
  if [[ -z "$plugin" ]]; then
    log "real node: cargo build -p teifleet-fake-gpu-plugin"
    (cd "$REPO" && cargo build --quiet --locked -p teifleet-fake-gpu-plugin) || { log "the device plugin did not build"; return 1; }
    plugin="$REPO/target/debug/teifleet-fake-gpu-plugin"
  fi
  local images; images="$("$HERE/node-images.sh")"
  local snapshotter; snapshotter="$(real_node_snapshotter)"
  echo "$snapshotter" >"$node/snapshotter"

  cat >"$node/containerd.toml" <<EOF
version = 2
root = "$node/containerd/root"
state = "$node/containerd/state"
[grpc]
  address = "$node/containerd/containerd.sock"
[ttrpc]
  address = "$node/containerd/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$node/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # Root here lacks CAP_SYS_RESOURCE: without this, runc cannot lower a container's OOM score and
  # every sandbox fails ("can't get final child's PID from pipe").
  restrict_oom_score_adj = true
  enable_unprivileged_ports = true
  enable_unprivileged_icmp = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "$snapshotter"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    # The cluster's own CNI configuration, never the machine's /etc/cni/net.d.
    conf_dir = "$node/cni/net.d"
    max_conf_num = 1
EOF
  cat >"$node/cni/net.d/10-teifleet.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "teifleet",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$REAL_NODE_BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$node/cni/ipam",
        "ranges": [[{"subnet": "$REAL_NODE_POD_CIDR", "gateway": "$REAL_NODE_POD_GATEWAY"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF

  log "real node: containerd $(containerd --version | awk '{print $3}') ($snapshotter snapshotter), images $PAUSE_IMAGE and $ECHO_IMAGE"
  start containerd containerd --config "$node/containerd.toml"
  wait_for containerd 30 ctr_node version
  real_node_import "$images"/*.tar >/dev/null

  cat >"$node/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $REAL_NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: "$PKI/ca.crt"}
authorization: {mode: Webhook}
containerRuntimeEndpoint: "unix://$node/containerd/containerd.sock"
cgroupDriver: cgroupfs
failSwapOn: false
oomScoreAdj: 0
podLogsDir: "$node/pod-logs"
resolvConf: /etc/resolv.conf
registerWithTaints:
- {key: $REAL_NODE_TAINT_KEY, value: "true", effect: NoSchedule}
# A shared build machine: evict nothing, collect no images. Disk thresholds are absolute: 1% of a
# large disk that a cold build has nearly filled is gigabytes, and DiskPressure would taint the
# node NoSchedule, leaving every pod Pending.
evictionHard: {memory.available: "100Mi", nodefs.available: "100Mi", nodefs.inodesFree: "1%", imagefs.available: "100Mi"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
shutdownGracePeriod: 0s
EOF
  log "real node: kubelet $REAL_NODE_NAME on $REAL_NODE_IP ($REAL_NODE_GPUS fake $REAL_NODE_GPU_PRODUCT GPUs)"
  start kubelet "$BIN/kubelet" --config "$node/kubelet.yaml" --kubeconfig "$node/kubelet.kubeconfig" \
    --root-dir "$node/kubelet" --cert-dir "$node/kubelet/pki" --hostname-override "$REAL_NODE_NAME" --node-ip "$REAL_NODE_IP" \
    --node-labels "nvidia.com/gpu.product=$REAL_NODE_GPU_PRODUCT,nvidia.com/gpu.count=$REAL_NODE_GPUS,$REAL_NODE_TAINT_KEY=true,nvidia.com/gpu.sharing-strategy=time-slicing,nvidia.com/gpu.replicas=$REAL_NODE_SHARED_REPLICAS"

  # kube-proxy stops when its configuration file changes: written once, before it starts.
  cat >"$node/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: "$node/kube-proxy.kubeconfig"}
mode: iptables
hostnameOverride: $REAL_NODE_NAME
bindAddress: $REAL_NODE_IP
clusterCIDR: $REAL_NODE_POD_CIDR
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: ["$REAL_NODE_IP/32"]
oomScoreAdj: 0
# Leave the machine's conntrack settings and route_localnet as they are.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
iptables: {localhostNodePorts: false, syncPeriod: 30s, minSyncPeriod: 0s}
EOF
  start kube-proxy "$BIN/kube-proxy" --config "$node/kube-proxy.yaml"

  wait_for "the kubelet's device-plugin socket" 60 test -S "$REAL_NODE_PLUGIN_DIR/kubelet.sock"
  start fake-gpu-plugin "$plugin" --count "$REAL_NODE_GPUS" --plugin-dir "$REAL_NODE_PLUGIN_DIR"
  start fake-gpu-plugin-shared "$plugin" --resource-name "$REAL_NODE_SHARED_RESOURCE" --count 1 \
    --replicas "$REAL_NODE_SHARED_REPLICAS" --id-prefix fake-l4-shared --socket-name teifleet-fake-gpu-shared.sock \
    --plugin-dir "$REAL_NODE_PLUGIN_DIR"

  wait_for "node $REAL_NODE_NAME to become Ready" 90 kubectl wait --for=condition=Ready "node/$REAL_NODE_NAME" --timeout=1s
  wait_for "$REAL_NODE_GPUS nvidia.com/gpu on $REAL_NODE_NAME" 60 bash -c \
    "[[ \"\$(kubectl get node $REAL_NODE_NAME -o jsonpath='{.status.allocatable.nvidia\\.com/gpu}')\" == $REAL_NODE_GPUS ]]"
  wait_for "$REAL_NODE_SHARED_REPLICAS $REAL_NODE_SHARED_RESOURCE on $REAL_NODE_NAME" 60 bash -c \
    "[[ \"\$(kubectl get node $REAL_NODE_NAME -o jsonpath='{.status.allocatable.nvidia\\.com/gpu\\.shared}')\" == $REAL_NODE_SHARED_REPLICAS ]]"
  log "real node: $REAL_NODE_NAME Ready with $REAL_NODE_GPUS nvidia.com/gpu and $REAL_NODE_SHARED_REPLICAS $REAL_NODE_SHARED_RESOURCE in $((SECONDS - started)) s"
}

# stop_pids NAME...: SIGTERM to each process up.sh started under these names, up to 10 s for all
# of them to exit, then SIGKILL.
stop_pids() {
  local name pid pids=() deadline=$((SECONDS + 10))
  for name in "$@"; do
    [[ -f "$DIR/pids/$name.pid" ]] || continue
    pids+=("$(cat "$DIR/pids/$name.pid")")
    rm -f "$DIR/pids/$name.pid"
  done
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
}

# alive NAME [CLUSTER_DIR]: whether the process that cluster (this one by default) started as NAME
# still runs. The command name is compared too, since a recorded pid may since belong to another
# process (a cluster directory can outlive its processes: a machine restarted, its disk copied).
alive() {
  local pidfile="${2:-$DIR}/pids/$1.pid" pid
  [[ -f "$pidfile" ]] || return 1
  pid="$(cat "$pidfile")"
  [[ "$pid" =~ ^[0-9]+$ && "$(cat "/proc/$pid/comm" 2>/dev/null)" == "$1"* ]]
}

# unmount_under DIR: every mount below DIR, deepest first.
unmount_under() {
  local mount
  while read -r mount; do
    umount "$mount" 2>/dev/null || umount -l "$mount" 2>/dev/null || true
  done < <(awk -v prefix="$1/" 'index($2, prefix) == 1 {print $2}' /proc/self/mounts | sort -r)
}

# Stops the real node and removes what it added to the machine; safe to run at any stage.
real_node_stop() {
  local node; node="$(real_node_dir)"
  [[ -d "$node" || ( -f "$REAL_NODE_LOCK" && "$(cat "$REAL_NODE_LOCK")" == "$DIR" ) ]] || return 0
  local kubeconfig="$DIR/kubeconfig" kubectl="$CACHE/current/kubectl"

  # Pods first, through the kubelet, so their sandboxes are torn down by the CNI plugins.
  if alive kubelet && alive containerd && "$kubectl" --kubeconfig "$kubeconfig" get --raw /readyz >/dev/null 2>&1; then
    "$kubectl" --kubeconfig "$kubeconfig" delete pods --all-namespaces --field-selector "spec.nodeName=$REAL_NODE_NAME" \
      --grace-period=0 --force --wait=false >/dev/null 2>&1 || true
    for _ in $(seq 60); do
      [[ -z "$(ctr_node tasks ls -q 2>/dev/null)" ]] && break
      sleep 0.5
    done
  fi
  stop_pids fake-gpu-plugin fake-gpu-plugin-shared kube-proxy kubelet

  # Whatever still runs: kill the tasks (the shims then exit) and remove the pods' network
  # namespaces, which takes their veths with them.
  if alive containerd; then
    local id netns
    for id in $(ctr_node tasks ls -q 2>/dev/null); do
      ctr_node tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true
    done
    sleep 0.5
    for id in $(ctr_node containers ls -q 2>/dev/null); do
      ctr_node tasks delete -f "$id" >/dev/null 2>&1 || true
      for netns in $(ctr_node containers info "$id" 2>/dev/null | grep -o '"/var/run/netns/cni-[^"]*"\|"/run/netns/cni-[^"]*"' | tr -d '"' | sort -u); do
        umount "$netns" 2>/dev/null || true
        rm -f "$netns"
      done
    done
  fi
  stop_pids containerd
  # Containers that could not be deleted: their init (PID recorded by containerd) and its parent,
  # the shim, if it is this containerd's.
  local pidfile pid shim
  while read -r pidfile; do
    pid="$(cat "$pidfile" 2>/dev/null)" || continue
    kill -0 "$pid" 2>/dev/null || continue
    shim="$(awk '/^PPid:/ {print $2}' "/proc/$pid/status" 2>/dev/null)"
    kill -9 "$pid" 2>/dev/null || true
    if [[ -n "$shim" ]] && tr '\0' ' ' <"/proc/$shim/cmdline" 2>/dev/null | grep -qF -- "-address $node/containerd/containerd.sock "; then
      kill -9 "$shim" 2>/dev/null || true
    fi
  done < <(find "$node/containerd/state" -name init.pid 2>/dev/null)

  # Mounts under the node's directory (pod volumes, container root filesystems).
  unmount_under "$node"

  local link
  for link in $(ip -o link show master "$REAL_NODE_BRIDGE" 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1); do
    ip link del "$link" 2>/dev/null || true
  done
  ip link del "$REAL_NODE_BRIDGE" 2>/dev/null || true
  ip link del "$REAL_NODE_VETH" 2>/dev/null || true

  real_node_iptables_cleanup "$node"

  if [[ -f "$node/sysctls" ]]; then
    local setting
    while read -r setting; do
      sysctl -q -w "$setting" >/dev/null 2>&1 || true
    done <"$node/sysctls"
  fi

  # The kubelet's pod cgroups, in every hierarchy, once their processes are gone.
  local hierarchy
  for hierarchy in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
    [[ -d "$hierarchy/kubepods" ]] && find "$hierarchy/kubepods" -depth -type d -exec rmdir {} + 2>/dev/null
  done

  local path
  for path in "${REAL_NODE_HOST_PATHS[@]}"; do
    if [[ -f "$node/host-paths-before" ]] && ! grep -qxF "$path" "$node/host-paths-before"; then
      # Pods' network namespaces stay mounted when containerd died before it could remove them.
      unmount_under "$path"
      rm -rf --one-file-system "$path"
    fi
  done
  # Left only when /var/lib/kubelet was there before.
  rm -f "$REAL_NODE_PLUGIN_DIR/kubelet.sock" "$REAL_NODE_PLUGIN_DIR/teifleet-fake-gpu.sock" \
    "$REAL_NODE_PLUGIN_DIR/teifleet-fake-gpu-shared.sock" \
    "$REAL_NODE_PLUGIN_DIR/kubelet_internal_checkpoint"
  [[ -f "$REAL_NODE_LOCK" && "$(cat "$REAL_NODE_LOCK")" == "$DIR" ]] && rm -f "$REAL_NODE_LOCK"
  return 0
}

# Removes the KUBE-* and CNI-* chains and the rules that jump to them, in iptables and ip6tables;
# then the tables that did not exist before the node started, if they are empty (needs nft).
real_node_iptables_cleanup() {
  local node="$1" family cmd table rule chain chains
  command -v iptables >/dev/null 2>&1 || return 0
  [[ -x "$CACHE/current/kube-proxy" ]] && timeout 30 "$CACHE/current/kube-proxy" --cleanup >/dev/null 2>&1
  for cmd in iptables ip6tables; do
    for table in filter nat mangle raw; do
      "$cmd" -t "$table" -S >/dev/null 2>&1 || continue
      while read -r rule; do
        eval "$cmd -t $table -D ${rule#-A }" 2>/dev/null || true
      done < <("$cmd" -t "$table" -S | grep -E '^-A (PREROUTING|INPUT|FORWARD|OUTPUT|POSTROUTING) .*-j (KUBE|CNI)-')
      mapfile -t chains < <("$cmd" -t "$table" -S | sed -n 's/^-N \(\(KUBE\|CNI\)-[^ ]*\)$/\1/p')
      for chain in "${chains[@]}"; do "$cmd" -t "$table" -F "$chain" 2>/dev/null || true; done
      for chain in "${chains[@]}"; do "$cmd" -t "$table" -X "$chain" 2>/dev/null || true; done
    done
  done
  command -v nft >/dev/null 2>&1 || return 0
  while read -r family table; do
    grep -qxF "$family $table" "$node/iptables-tables-before" 2>/dev/null && continue
    # iptables-nft leaves its base chains behind; a table with nothing else in it goes.
    if ! nft list table "$family" "$table" 2>/dev/null | grep -qvE '^\s*(table |chain |type |\}|$)'; then
      nft delete table "$family" "$table" 2>/dev/null || true
    fi
  done < <(nft list tables 2>/dev/null | awk '$1 == "table" && ($2 == "ip" || $2 == "ip6") {print $2, $3}')
}
