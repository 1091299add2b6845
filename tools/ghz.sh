#!/usr/bin/env bash
# Prints the path of ghz (the gRPC load tool users run against TEI), building it once per version
# from the Go module proxy into a cache outside the repository.
#
#   ghz=$(tools/ghz.sh)
set -euo pipefail
GHZ_VERSION=v0.120.0
CACHE="${TEIFLEET_CACHE:-$HOME/.cache/teifleet}"
root="$CACHE/ghz-$GHZ_VERSION"
if [[ ! -x "$root/ghz" ]]; then
  command -v go >/dev/null 2>&1 || { echo "[ghz] Go is required to build ghz" >&2; exit 1; }
  echo "[ghz] building ghz $GHZ_VERSION into $root (once per version)" >&2
  mkdir -p "$root"
  GOBIN="$root" GOFLAGS=-trimpath go install "github.com/bojand/ghz/cmd/ghz@$GHZ_VERSION" >&2
fi
echo "$root/ghz"
