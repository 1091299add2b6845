#!/usr/bin/env bash
# Imports image archives (docker-archive tarballs, as `make images` writes them) into the real
# node's containerd: no registry is reachable from the node, and the kubelet then finds the images
# by their tags (imagePullPolicy IfNotPresent or Never).
#
#   tests/cluster/import-images.sh target/images/operator.tar [more.tar ...]
#
# The cluster is the one in $TEIFLEET_CLUSTER_DIR (default .cluster), started with its real node
# (make cluster-up). Prints what containerd unpacked.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
DIR="${TEIFLEET_CLUSTER_DIR:-$REPO/.cluster}"
# shellcheck source-path=SCRIPTDIR source=real-node.sh
source "$HERE/real-node.sh"

(($#)) || { echo "usage: $0 IMAGE.tar..." >&2; exit 2; }
socket="$(real_node_dir)/containerd/containerd.sock"
[[ -S "$socket" ]] || { echo "no real node runs in $DIR (no $socket): make cluster-up starts one" >&2; exit 1; }
real_node_import "$@"
