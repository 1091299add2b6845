#!/usr/bin/env bash
# Builds the local control plane's binaries from the Go module proxy and caches them outside the
# repository, keyed by version, so only the first run on a machine pays the ~10 minute build.
# Kubernetes' node binaries (kubelet, kube-proxy) come from the same build; the real node's
# container runtime, CNI plugins and iptables come from Debian's packages.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.33.13}"
KWOK_VERSION="${KWOK_VERSION:-v0.7.0}"
HELM_VERSION="${HELM_VERSION:-v3.18.6}"
# The Kubernetes binaries built, and the recipe's suffix on their cache directory: bump it whenever
# the recipe or the set of binaries changes (b3: kubelet and kube-proxy, for the real node).
K8S_BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy)
K8S_RECIPE=b3
CACHE="${TEIFLEET_CACHE:-$HOME/.cache/teifleet}"
BIN="$CACHE/bin"
mkdir -p "$BIN"

log() { echo "[install-binaries] $*" >&2; }

# Go's module and build caches of a cold build (several GB for Kubernetes) are thrown away once the
# binaries are cached: they would be read again only for a new version, and on a CI machine they
# fill the disk the real node's kubelet watches for DiskPressure.
# tests/cluster/prereqs.sh shares one set (TEIFLEET_GO_SCRATCH) among every tool it builds.
scratch_go_caches() {
  [[ -n "${TEIFLEET_GO_SCRATCH:-}" ]] && return
  export TEIFLEET_GO_SCRATCH; TEIFLEET_GO_SCRATCH="$(mktemp -d)"
  trap 'chmod -R u+w "$TEIFLEET_GO_SCRATCH" 2>/dev/null || true; rm -rf "$TEIFLEET_GO_SCRATCH"' EXIT
  export GOCACHE="$TEIFLEET_GO_SCRATCH/build" GOMODCACHE="$TEIFLEET_GO_SCRATCH/mod" GOFLAGS=-modcacherw
}

ensure_etcd() {
  if command -v etcd >/dev/null 2>&1; then return; fi
  log "installing etcd-server from Debian"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq etcd-server >/dev/null
  # Debian enables an etcd service; the tests start their own.
  (systemctl disable --now etcd >/dev/null 2>&1 || service etcd stop >/dev/null 2>&1 || true)
}

# What the real node (tests/cluster/node-up.sh) runs besides the kubelet and kube-proxy: containerd
# and runc, the CNI plugins (bridge, host-local, portmap, loopback in /usr/lib/cni), iptables for
# kube-proxy (nft to remove the tables it leaves), and a C compiler with static libc for the pause
# image.
ensure_node_packages() {
  local absent=() package
  for package in containerd runc containernetworking-plugins iptables nftables gcc libc6-dev; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' || absent+=("$package")
  done
  ((${#absent[@]})) || return 0
  if [[ "$(id -u)" != 0 ]]; then
    log "the real node needs ${absent[*]} (Debian packages): install them as root, or set TEIFLEET_REAL_NODE=0"
    return 0
  fi
  log "installing ${absent[*]} from Debian"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${absent[@]}" >/dev/null
  # Debian enables a containerd service; the real node starts its own, with its own state.
  (systemctl disable --now containerd >/dev/null 2>&1 || service containerd stop >/dev/null 2>&1 || true)
}

build_kubernetes() {
  # The suffix changes whenever the build recipe does, so caches from older recipes are not reused.
  local out="$BIN/k8s-$K8S_VERSION-$K8S_RECIPE"
  local wanted=("${K8S_BINARIES[@]}")
  local missing=0
  for b in "${wanted[@]}"; do [[ -x "$out/$b" ]] || missing=1; done
  [[ $missing == 0 ]] && return
  log "building Kubernetes $K8S_VERSION (about 10 minutes cold on 2 cores)"
  scratch_go_caches
  local mod tmp; mod="$(mktemp -d)"
  # Built beside the cache entry and renamed into place, so a concurrent run never sees half of it.
  tmp="$(mktemp -d "$out.tmp.XXXXXX")"; chmod 755 "$tmp"
  (
    cd "$mod"
    go mod init teifleet.local/k8sbuild >/dev/null 2>&1
    local gomod
    gomod="$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
    # k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces them with local paths;
    # a consumer must point each one at its published version instead.
    local staging_version="v0${K8S_VERSION#v1}"
    {
      echo "require k8s.io/kubernetes $K8S_VERSION"
      grep -oE '^\s*k8s\.io/[a-z0-9-]+ => \./staging' "$gomod" | awk '{print $1}' | sort -u |
        while read -r m; do echo "replace $m => $m $staging_version"; done
    } >>go.mod
    # Pin the version in `go get`, or it resolves the newest Kubernetes instead.
    local pkgs=()
    for b in "${wanted[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$b@$K8S_VERSION"); done
    go get "${pkgs[@]}" >/dev/null
    # Built outside Kubernetes' own scripts, the binaries would report v0.0.0-master; stamp the
    # real version so clients (helm's kubeVersion checks, kubectl version skew) see it.
    local minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
    local ldflags=""
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
      ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
    done
    for b in "${wanted[@]}"; do
      log "go build k8s.io/kubernetes/cmd/$b"
      CGO_ENABLED=0 go build -ldflags "$ldflags" -o "$tmp/$b" "k8s.io/kubernetes/cmd/$b"
    done
  )
  rm -rf "$mod" "$out"
  mv "$tmp" "$out"
}

go_install() { # name module version
  local name="$1" module="$2" version="$3"
  local out="$BIN/$name-$version"
  [[ -x "$out/$name" ]] && return
  log "go install $module@$version"
  scratch_go_caches
  mkdir -p "$out.tmp"
  CGO_ENABLED=0 GOBIN="$out.tmp" go install "$module@$version"
  rm -rf "$out"; mv "$out.tmp" "$out"
}

ensure_etcd
ensure_node_packages
build_kubernetes
go_install kwok sigs.k8s.io/kwok/cmd/kwok "$KWOK_VERSION"
go_install helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION"

# A stable directory of links so scripts and tests need only one PATH entry.
CUR="$CACHE/current"
mkdir -p "$CUR"
for b in "${K8S_BINARIES[@]}"; do
  ln -sf "$BIN/k8s-$K8S_VERSION-$K8S_RECIPE/$b" "$CUR/$b"
done
ln -sf "$BIN/kwok-$KWOK_VERSION/kwok" "$CUR/kwok"
ln -sf "$BIN/helm-$HELM_VERSION/helm" "$CUR/helm"
# etcd comes from Debian: look it up without $CUR, or a PATH that lists $CUR first (as the demo's
# did) would link $CUR/etcd to itself.
ETCD="$(PATH="$(tr ':' '\n' <<<"$PATH" | grep -vxF -e "$CUR" -e "$CUR/" | paste -sd:)" command -v etcd)"
ln -sf "$ETCD" "$CUR/etcd"
log "binaries ready in $CUR"
