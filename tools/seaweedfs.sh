#!/usr/bin/env bash
# Prints the path of SeaweedFS's `weed` (the S3-compatible store the embedding-job tests use),
# building it once per version from the Go module proxy into a cache outside the repository.
#
#   weed=$(tools/seaweedfs.sh)
#
# `go install module@version` refuses SeaweedFS (its go.mod has a replace directive), so
# tools/go-main-module.sh builds it as the main module. About 10 minutes of CPU the first time;
# the cache is keyed by the version below.
set -euo pipefail
SEAWEEDFS_VERSION=v0.0.0-20261109003541-7506e5f91cd6
exec "$(dirname "${BASH_SOURCE[0]}")/go-main-module.sh" seaweedfs weed github.com/seaweedfs/seaweedfs \
  "$SEAWEEDFS_VERSION" ./weed
