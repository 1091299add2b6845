#!/usr/bin/env bash
# Installs the image tool, crane (go-containerregistry), from the Go module proxy and caches it
# outside the repository keyed by version, as tests/cluster/install-binaries.sh does for the
# control plane: images are built, checked and pushed without a Docker engine.
# Prints the path of the crane binary on stdout.
set -euo pipefail

CRANE_VERSION="${CRANE_VERSION:-v0.22.1}"
CACHE="${TEIFLEET_CACHE:-$HOME/.cache/teifleet}"
OUT="$CACHE/bin/crane-$CRANE_VERSION"

log() { echo "[install-tools] $*" >&2; }
die() { log "error: $*"; exit 1; }

if [[ ! -x "$OUT/crane" ]]; then
  command -v go >/dev/null 2>&1 || die "Go is required to install crane $CRANE_VERSION (go install from the module proxy)"
  log "go install github.com/google/go-containerregistry/cmd/crane@$CRANE_VERSION"
  rm -rf "$OUT.tmp"
  mkdir -p "$OUT.tmp"
  CGO_ENABLED=0 GOBIN="$OUT.tmp" go install "github.com/google/go-containerregistry/cmd/crane@$CRANE_VERSION" ||
    die "go install of crane $CRANE_VERSION failed (is the Go module proxy reachable?)"
  rm -rf "$OUT"
  mv "$OUT.tmp" "$OUT"
fi

# What the image build needs from the machine besides crane; all of it is on Debian by default.
for tool in tar dpkg-deb dpkg-query apt-get ldd sha256sum; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool is required to build images (a Debian machine has it)"
done
grep -q 'GNU tar' <<<"$(tar --version)" || die "GNU tar is required (reproducible layers need --sort=name and --mtime)"
# apt-get download needs Debian's package lists, which fresh containers often ship without.
if ! compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null; then
  [[ "$(id -u)" == 0 ]] || die "Debian's package lists are missing: run sudo apt-get update"
  log "apt-get update (no package lists yet)"
  apt-get update -qq >/dev/null
fi

# Next to the control-plane binaries, so one PATH entry finds every tool.
mkdir -p "$CACHE/current"
ln -sf "$OUT/crane" "$CACHE/current/crane"
echo "$OUT/crane"
