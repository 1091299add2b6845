#!/usr/bin/env bash
# Fails when building the end-to-end tests alone (`cargo test -p teifleet-e2e`, what
# `make test-cluster` runs) would turn on different features of a shared dependency than `make
# unit`'s workspace build (`cargo test --workspace --exclude teifleet-e2e`). Cargo unifies features
# over the packages a command selects, so a difference gives the two builds different hashes for
# that crate and everything above it: every shared library compiled twice, on disk twice.
# The cure is a line in tests/e2e/Cargo.toml's [dev-dependencies] turning the feature on there too.
set -euo pipefail
cd "$(dirname "$0")/.."

# The selection of tools/build-debug.sh and make unit.
tree() { cargo tree --locked -e normal,dev,build -f '{p} [{f}]' --prefix none "$@" | sed 's/ (\*)$//' | sort -u; }

workspace=$(mktemp) e2e=$(mktemp)
trap 'rm -f "$workspace" "$e2e"' EXIT
tree --workspace --exclude teifleet-e2e >"$workspace"
tree -p teifleet-e2e | grep -v '^teifleet-e2e ' >"$e2e"
# Crates the e2e tests alone use are not shared: only those the workspace also builds can drift.
drift=$(comm -13 "$workspace" "$e2e" | while read -r line; do
  grep -qF "${line%% \[*} [" "$workspace" && echo "$line"
done || true)
if [[ -n "$drift" ]]; then
  echo "teifleet-e2e alone resolves these crates with other features than make unit's workspace build:" >&2
  while read -r line; do
    crate=${line%% \[*}
    echo "  e2e:       $line" >&2
    echo "  workspace: $(grep -F "$crate [" "$workspace")" >&2
  done <<<"$drift"
  echo "turn the workspace's features on in tests/e2e/Cargo.toml [dev-dependencies] (see the comment there)" >&2
  exit 1
fi
echo "feature-drift: teifleet-e2e shares make unit's build of every common dependency"
