#!/usr/bin/env bash
# Prints the path of a Go command-line tool the tests run as users do, building it once per
# version from the Go module proxy into a cache outside the repository:
#
#   grpcurl=$(tools/go-tool.sh grpcurl)   # docs/clients.md's shell examples (test_grpcurl.py)
#   ghz=$(tools/go-tool.sh ghz)           # the gRPC load tool users point at TEI (test_ghz.py)
set -euo pipefail
case "${1:-}" in
  grpcurl) module=github.com/fullstorydev/grpcurl version=v1.9.3 ;;
  ghz) module=github.com/bojand/ghz version=v0.120.0 ;;
  *) echo "usage: $0 grpcurl|ghz" >&2; exit 2 ;;
esac
exec "$(dirname "${BASH_SOURCE[0]}")/go-main-module.sh" "$1" "$1" "$module" "$version" "./cmd/$1"
