#!/usr/bin/env bash
# Pushes the images images/build.sh wrote to REGISTRY, as REGISTRY/<name>:<version>, with crane,
# and checks that the registry holds exactly the digests that were built:
#
#   REGISTRY=ghcr.io/teifleet images/push.sh [--out target/images]
#
# Credentials are crane's (and docker's) usual ones: `crane auth login`, or ~/.docker/config.json.
# Registries on localhost or 127.0.0.1 are spoken to over plain HTTP, as crane does by default.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$ROOT/target/images"
while (($#)); do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    *) echo "usage: REGISTRY=<host/namespace> $0 [--out DIR]" >&2; exit 2 ;;
  esac
done

log() { echo "[push] $*" >&2; }
die() { log "error: $*"; exit 1; }

[[ -n "${REGISTRY:-}" ]] || die "set REGISTRY, e.g. make push REGISTRY=ghcr.io/<you>"
REGISTRY="${REGISTRY%/}"
[[ -s "$OUT/images.txt" ]] || die "$OUT/images.txt is missing: run make images first"
CRANE="${CRANE:-$("$ROOT/images/install-tools.sh")}"

while read -r name ref digest _; do
  tag="${ref##*:}"
  target="$REGISTRY/$name:$tag"
  log "$name -> $target"
  "$CRANE" push "$OUT/$name.tar" "$target" >/dev/null
  pushed="$("$CRANE" digest "$target")"
  [[ "$pushed" == "$digest" ]] || die "$target has digest $pushed, but $digest was built"
  echo "$target@$digest"
done <"$OUT/images.txt"
