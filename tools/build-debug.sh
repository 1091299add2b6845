#!/usr/bin/env bash
# The one debug build that `make test`'s steps share: the workspace less the e2e tests, every
# target. Cargo unifies dependencies' features over the packages and targets a command selects, so a
# step that built `-p teifleet-multiplexer --bins` alone would compile tokio (without the test-util
# its tests turn on) and everything above it again, and overwrite target/debug's binaries with
# another build of them. After `make unit` (`cargo test` with this selection) this compiles nothing;
# run alone, it builds what `make unit` would. The e2e crate keeps to the same features:
# tools/feature-drift.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo build --locked --workspace --exclude teifleet-e2e --all-targets "$@"
