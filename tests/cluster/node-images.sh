#!/usr/bin/env bash
# Builds the real node's two images without a Docker engine and caches them outside the
# repository, keyed by their sources:
#   teifleet.local/pause:1  the pod sandbox (tests/cluster/node/pause.c), containerd's sandbox image
#   teifleet.local/echo:1   a tiny HTTP server for the real-node tests (tests/cluster/node/echo.c)
# Each is one static binary (gcc -static) in one layer on an empty base, assembled by crane
# (images/install-tools.sh) in a throwaway registry on 127.0.0.1 and written as a docker-archive
# tarball that `ctr images import` takes; no registry is reachable from the cluster.
#
# Prints the directory holding pause.tar and echo.tar.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
# shellcheck source=images/lib.sh
. "$REPO/images/lib.sh"
CACHE="${TEIFLEET_CACHE:-$HOME/.cache/teifleet}"

log() { echo "[node-images] $*" >&2; }
die() { log "error: $*"; exit 1; }

# name, source, reference; the entrypoint is /<name>.
IMAGES=(
  "pause node/pause.c teifleet.local/pause:1"
  "echo node/echo.c teifleet.local/echo:1"
)

key="$(cat "$HERE/node/pause.c" "$HERE/node/echo.c" "${BASH_SOURCE[0]}" <(gcc --version | head -n1) | sha256sum | cut -c1-16)"
OUT="$CACHE/node-images/$key"
if [[ -f "$OUT/pause.tar" && -f "$OUT/echo.tar" ]]; then
  echo "$OUT"
  exit 0
fi

command -v gcc >/dev/null 2>&1 || die "gcc is required (Debian: gcc, libc6-dev)"
CRANE="${CRANE:-$("$REPO/images/install-tools.sh")}"
mkdir -p "$CACHE/node-images"
WORK="$(mktemp -d "$CACHE/node-images/.work.XXXXXX")"
REGISTRY_PID=""
cleanup() {
  if [[ -n "$REGISTRY_PID" ]]; then kill "$REGISTRY_PID" 2>/dev/null || true; wait "$REGISTRY_PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

start_local_registry "$CRANE" "$WORK/registry.log" || die "crane's scratch registry did not start"
port="$REGISTRY_PORT"

mkdir -p "$WORK/out"
for image in "${IMAGES[@]}"; do
  read -r name source ref <<<"$image"
  log "building $ref from tests/cluster/$source"
  rootfs="$WORK/rootfs-$name"
  mkdir -p "$rootfs"
  gcc -static -Os -Wall -Wextra -Werror -o "$rootfs/$name" "$HERE/$source" || die "gcc -static failed (is libc6-dev installed?)"
  strip "$rootfs/$name"
  # One file, owned by root, at the epoch: the layer's bytes depend on the binary alone.
  tar --create --file="$WORK/$name.tar" --directory="$rootfs" --sort=name --mtime=@0 \
    --owner=0 --group=0 --numeric-owner --format=posix --pax-option=delete=atime,delete=ctime "$name"
  "$CRANE" append --oci-empty-base -f "$WORK/$name.tar" -t "127.0.0.1:$port/$name:build" >"$WORK/crane.log" 2>&1 ||
    { cat "$WORK/crane.log" >&2; die "crane append failed for $name"; }
  "$CRANE" mutate "127.0.0.1:$port/$name:build" --set-platform "linux/$(dpkg --print-architecture)" \
    --entrypoint "/$name" --workdir / -l "org.opencontainers.image.title=teifleet-$name" \
    -t "$ref" -o "$WORK/out/$name.tar" >"$WORK/crane.log" 2>&1 ||
    { cat "$WORK/crane.log" >&2; die "crane mutate failed for $name"; }
done

rm -rf "$OUT"
mv "$WORK/out" "$OUT"
log "images ready in $OUT"
echo "$OUT"
