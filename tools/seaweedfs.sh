#!/usr/bin/env bash
# Prints the path of SeaweedFS's `weed` (the S3-compatible store the embedding-job tests use),
# building it once per version from the Go module proxy into a cache outside the repository.
#
#   weed=$(tools/seaweedfs.sh)
#
# `go install module@version` refuses SeaweedFS (its go.mod has a replace directive), so the module
# is downloaded and built as the main module, with its own go.sum. About 10 minutes of CPU the
# first time; the cache is keyed by the version below.
set -euo pipefail
SEAWEEDFS_VERSION=v0.0.0-20261109003541-7506e5f91cd6
MODULE=github.com/seaweedfs/seaweedfs
CACHE="${TEIFLEET_CACHE:-$HOME/.cache/teifleet}"
out="$CACHE/seaweedfs-$SEAWEEDFS_VERSION/weed"
if [[ ! -x "$out" ]]; then
  command -v go >/dev/null 2>&1 || { echo "[seaweedfs] Go is required to build weed" >&2; exit 1; }
  echo "[seaweedfs] building weed $SEAWEEDFS_VERSION into $out (once per version)" >&2
  # Go's caches of this build go with it (read again only for a new version), unless
  # tests/cluster/prereqs.sh made the caches every tool it builds shares (TEIFLEET_GO_SCRATCH).
  if [[ -z "${TEIFLEET_GO_SCRATCH:-}" ]]; then
    scratch=$(mktemp -d)
    trap 'chmod -R u+w "$scratch" 2>/dev/null || true; rm -rf "$scratch"' EXIT
    export GOCACHE="$scratch/build" GOMODCACHE="$scratch/mod" GOFLAGS="${GOFLAGS:-} -modcacherw"
  fi
  dir=$(go mod download -json "$MODULE@$SEAWEEDFS_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [[ -d "$dir" ]] || { echo "[seaweedfs] could not download $MODULE@$SEAWEEDFS_VERSION" >&2; exit 1; }
  mkdir -p "$(dirname "$out")"
  (cd "$dir" && go build -trimpath -ldflags=-s -o "$out.partial" ./weed)
  mv "$out.partial" "$out"
fi
echo "$out"
