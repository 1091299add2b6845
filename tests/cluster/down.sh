#!/usr/bin/env bash
# Stops the local control plane started by up.sh and removes its state; first the real node, if
# one runs, and everything it added to the machine (tests/cluster/real-node.sh).
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
DIR="${TEIFLEET_CLUSTER_DIR:-$REPO/.cluster}"
CACHE="${TEIFLEET_CACHE:-$HOME/.cache/teifleet}"
log() { echo "[cluster-down] $*" >&2; }
# shellcheck source-path=SCRIPTDIR source=real-node.sh
source "$HERE/real-node.sh"
real_node_stop
[[ -d "$DIR/pids" ]] || exit 0
for name in kwok kube-scheduler kube-controller-manager kube-apiserver etcd; do
  pidfile="$DIR/pids/$name.pid"
  [[ -f "$pidfile" ]] || continue
  pid="$(cat "$pidfile")"
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
  kill -9 "$pid" 2>/dev/null || true
done
# Never through a mount point that survived the real node's cleanup.
rm -rf --one-file-system "$DIR"
log "stopped"
