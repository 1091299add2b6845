#!/usr/bin/env bash
# Prints the path of grpcurl (the command-line gRPC client docs/clients.md shows), building it once
# per version from the Go module proxy into a cache outside the repository.
#
#   grpcurl=$(tools/grpcurl.sh)
set -euo pipefail
GRPCURL_VERSION=v1.9.3
CACHE="${TEIFLEET_CACHE:-$HOME/.cache/teifleet}"
root="$CACHE/grpcurl-$GRPCURL_VERSION"
if [[ ! -x "$root/grpcurl" ]]; then
  command -v go >/dev/null 2>&1 || { echo "[grpcurl] Go is required to build grpcurl" >&2; exit 1; }
  echo "[grpcurl] building grpcurl $GRPCURL_VERSION into $root (once per version)" >&2
  mkdir -p "$root"
  GOBIN="$root" GOFLAGS=-trimpath go install "github.com/fullstorydev/grpcurl/cmd/grpcurl@$GRPCURL_VERSION" >&2
fi
echo "$root/grpcurl"
