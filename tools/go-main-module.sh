#!/usr/bin/env bash
# Prints the path of a Go program built as its module's main module, once per version, from the
# Go module proxy into a cache outside the repository ($TEIFLEET_CACHE/<name>-<version>/<binary>):
#
#   tools/go-main-module.sh NAME BINARY MODULE VERSION PACKAGE [go build flag...]
#
# For modules `go install module@version` refuses (a replace or exclude directive in their go.mod):
# the module is downloaded and built in its own directory, with its own go.sum (GOWORK=off: a
# go.work it ships may name modules its zip lacks). tools/seaweedfs.sh and tools/prometheus.sh.
set -euo pipefail
(($# >= 5)) || { echo "usage: $0 NAME BINARY MODULE VERSION PACKAGE [go build flag...]" >&2; exit 2; }
name=$1 binary=$2 module=$3 version=$4 package=$5
shift 5
CACHE="${TEIFLEET_CACHE:-$HOME/.cache/teifleet}"
out="$CACHE/$name-$version/$binary"
if [[ ! -x "$out" ]]; then
  command -v go >/dev/null 2>&1 || { echo "[$name] Go is required to build $binary" >&2; exit 1; }
  echo "[$name] building $binary $version into $out (once per version)" >&2
  # Go's caches of this build go with it (read again only for a new version), unless
  # tests/cluster/prereqs.sh made the caches every tool it builds shares (TEIFLEET_GO_SCRATCH).
  if [[ -z "${TEIFLEET_GO_SCRATCH:-}" ]]; then
    scratch=$(mktemp -d)
    trap 'chmod -R u+w "$scratch" 2>/dev/null || true; rm -rf "$scratch"' EXIT
    export GOCACHE="$scratch/build" GOMODCACHE="$scratch/mod" GOFLAGS="${GOFLAGS:-} -modcacherw"
  fi
  dir=$(go mod download -json "$module@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [[ -d "$dir" ]] || { echo "[$name] could not download $module@$version" >&2; exit 1; }
  mkdir -p "$(dirname "$out")"
  (cd "$dir" && GOWORK=off go build -trimpath -ldflags=-s "$@" -o "$out.partial" "$package")
  mv "$out.partial" "$out"
fi
echo "$out"
