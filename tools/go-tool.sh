#!/usr/bin/env bash
# Prints the path of a Go command-line tool the tests run as users do, building it once per
# version from the Go module proxy into a cache outside the repository:
#
#   grpcurl=$(tools/go-tool.sh grpcurl)   # docs/clients.md's shell examples (test_grpcurl.py)
#   ghz=$(tools/go-tool.sh ghz)           # the gRPC load tool users point at TEI (test_ghz.py)
set -euo pipefail
case "${1:-}" in
  grpcurl) package=github.com/fullstorydev/grpcurl/cmd/grpcurl version=v1.9.3 ;;
  ghz) package=github.com/bojand/ghz/cmd/ghz version=v0.120.0 ;;
  *) echo "usage: $0 grpcurl|ghz" >&2; exit 2 ;;
esac
name=$1
root="${TEIFLEET_CACHE:-$HOME/.cache/teifleet}/$name-$version"
if [[ ! -x "$root/$name" ]]; then
  command -v go >/dev/null 2>&1 || { echo "[$name] Go is required to build $name" >&2; exit 1; }
  echo "[$name] building $name $version into $root (once per version)" >&2
  # Go's caches of this build go with it (read again only for a new version), unless
  # tests/cluster/prereqs.sh made the caches every tool it builds shares (TEIFLEET_GO_SCRATCH).
  if [[ -z "${TEIFLEET_GO_SCRATCH:-}" ]]; then
    scratch=$(mktemp -d)
    trap 'chmod -R u+w "$scratch" 2>/dev/null || true; rm -rf "$scratch"' EXIT
    export GOCACHE="$scratch/build" GOMODCACHE="$scratch/mod" GOFLAGS="${GOFLAGS:-} -modcacherw"
  fi
  mkdir -p "$root"
  GOBIN="$root" GOFLAGS="${GOFLAGS:-} -trimpath" go install "$package@$version" >&2
fi
echo "$root/$name"
