#!/usr/bin/env bash
# Checks the image build end to end, without a Docker engine:
#   - two builds from the same binaries and commit give byte-identical archives (same digests);
#   - each archive is a valid image tagged as the chart and the operator expect
#     (REGISTRY/<name>:<crate version>), with the labels, user and entrypoint it should have;
#   - each image's binary runs from the image's own files (chroot as the image's user when root,
#     else through the image's loader), and tei-sim serves as TEI from it: gRPC health answers
#     SERVING, /metrics answers on the Prometheus port;
#   - the images and the chart are pushed to a local registry (crane's) with the same scripts the
#     release workflow runs, and read back with the digests that were built.
#
#   images/check.sh [--bin-dir target/release]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=images/lib.sh
. "$ROOT/images/lib.sh"
BIN_DIR="$ROOT/target/release"
while (($#)); do
  case "$1" in
    --bin-dir) BIN_DIR="$2"; shift 2 ;;
    *) echo "usage: $0 [--bin-dir DIR]" >&2; exit 2 ;;
  esac
done

log() { echo "[images-check] $*" >&2; }
die() { log "FAIL: $*"; exit 1; }

OUT="$ROOT/target/images-check"
rm -rf "$OUT"
mkdir -p "$OUT"
export CRANE="${CRANE:-$("$ROOT/images/install-tools.sh")}"
# What the chart and the operator reference by default, whatever REGISTRY the caller has set.
export REGISTRY=ghcr.io/teifleet
VERSION="$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$ROOT/Cargo.toml")"
PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

# --- Reproducible ---------------------------------------------------------------------------

# Fixed once for both builds, so a commit landing in between cannot tell them apart.
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git -C "$ROOT" log -1 --format=%ct)}"
export REVISION="${REVISION:-$(git -C "$ROOT" rev-parse HEAD)}"
start=$SECONDS
"$ROOT/images/build.sh" --bin-dir "$BIN_DIR" --out "$OUT/a"
"$ROOT/images/build.sh" --bin-dir "$BIN_DIR" --out "$OUT/b" >/dev/null
log "two builds in $((SECONDS - start)) s"
diff "$OUT/a/images.txt" "$OUT/b/images.txt" || die "two builds of one commit gave different digests"
while read -r name _; do
  cmp -s "$OUT/a/$name.tar" "$OUT/b/$name.tar" || die "$name.tar differs between two builds"
done <"$OUT/a/images.txt"
log "reproducible: both builds gave the same digests and bytes"

# --- What each image is ----------------------------------------------------------------------

[[ "$(wc -l <"$OUT/a/images.txt")" == 5 ]] || die "expected five images in $OUT/a/images.txt"
config_of() { # archive -> the image's config JSON
  local config
  config="$(tar -xOf "$1" manifest.json | sed -n 's/.*"Config":"\([^"]*\)".*/\1/p')"
  tar -xOf "$1" "$config"
}
json_has() { # json needle description
  grep -qF -- "$2" <<<"$1" || die "$3: $2 not found in $1"
}
declare -A USER_OF=()
while read -r name ref digest _; do
  archive="$OUT/a/$name.tar"
  [[ "$ref" == "$REGISTRY/$name:$VERSION" ]] || die "$name is tagged $ref, not $REGISTRY/$name:$VERSION"
  "$CRANE" validate --tarball "$archive" >/dev/null || die "$archive is not a valid image"
  [[ "$("$CRANE" digest --tarball "$archive")" == "$digest" ]] || die "$name's digest changed"
  json_has "$(tar -xOf "$archive" manifest.json)" "\"RepoTags\":[\"$ref\"]" "$name's archive tag"
  config="$(config_of "$archive")"
  json_has "$config" '"os":"linux"' "$name's platform"
  json_has "$config" "\"org.opencontainers.image.version\":\"$VERSION\"" "$name's labels"
  json_has "$config" "\"org.opencontainers.image.revision\":\"$REVISION\"" "$name's labels"
  json_has "$config" '"org.opencontainers.image.source":"https://github.com/teifleet/teifleet"' "$name's labels"
  user="$(sed -n 's/.*"User":"\([^"]*\)".*/\1/p' <<<"$config")"
  [[ "$user" =~ ^[1-9][0-9]*:[1-9][0-9]*$ ]] || die "$name must run as a numeric non-root user, not '$user'"
  USER_OF["$name"]="$user"
done <"$OUT/a/images.txt"
[[ "${USER_OF[operator]}" == 65532:65532 ]] || die "the chart runs the operator as 65532"
[[ "${USER_OF[multiplexer]}" == 1000:1000 && "${USER_OF[tei-sim]}" == 1000:1000 ]] ||
  die "the operator runs TEI pods as 1000"
[[ "${USER_OF[job]}" == 1000:1000 ]] || die "the operator runs EmbeddingJob workers as 1000"
[[ "${USER_OF[batch]}" == 1000:1000 ]] || die "the chart runs the batch API as 1000, the workers' user"

# The references the chart and the operator deploy by default are the ones built here.
chart="$ROOT/charts/teifleet"
grep -q "^appVersion: \"$VERSION\"" "$chart/Chart.yaml" || die "the chart's appVersion is not the crate version $VERSION"
grep -q "^  repository: $REGISTRY/operator\$" "$chart/values.yaml" || die "values.yaml's image.repository is not $REGISTRY/operator"
grep -q "^  repository: $REGISTRY/multiplexer\$" "$chart/values.yaml" || die "values.yaml's multiplexer.repository is not $REGISTRY/multiplexer"
grep -q "^  repository: $REGISTRY/job\$" "$chart/values.yaml" || die "values.yaml's job.repository is not $REGISTRY/job"
grep -q "^    repository: $REGISTRY/batch\$" "$chart/values.yaml" || die "values.yaml's batch.image.repository is not $REGISTRY/batch"

# --- The binaries run from the images' own files -----------------------------------------------

rootfs() { # name -> directory with the image's filesystem
  local dir="$OUT/rootfs/$1"
  mkdir -p "$dir"
  "$CRANE" export - - <"$OUT/a/$1.tar" | tar -x -C "$dir"
  [[ ! -e "$dir/bin/sh" ]] || die "$1 ships a shell"
  echo "$dir"
}
# Runs the image's binary with the image's files only: chrooted as the image's user when root,
# else with the image's loader and libraries (the host's are not searched either way). Always
# called in a subshell (`$(...)` or `&`), which `exec` replaces, so a background run's `$!` is the
# binary itself and cleanup stops it instead of orphaning it.
in_image() { # name user binary args...
  local dir="$OUT/rootfs/$1" user="$2" binary="$3"
  shift 3
  if [[ "$(id -u)" == 0 ]]; then
    exec env -i PATH=/usr/local/bin HOME=/tmp "${IN_IMAGE_ENV[@]}" "$CHROOT" --userspec="$user" "$dir" "/usr/local/bin/$binary" "$@"
  else
    exec env -i HOME=/tmp "${IN_IMAGE_ENV[@]}" "$dir/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" \
      --library-path "$dir/lib/x86_64-linux-gnu" "$dir/usr/local/bin/$binary" "$@"
  fi
}
IN_IMAGE_ENV=()
CHROOT="$(command -v chroot || echo /usr/sbin/chroot)"
[[ "$(id -u)" == 0 ]] || log "not root: running the binaries through the images' loader instead of chroot"
for entry in "operator teifleet-operator" "multiplexer teifleet-multiplexer" "tei-sim tei-sim" "job teifleet-job" \
  "batch teifleet-batch"; do
  read -r name binary <<<"$entry"
  rootfs "$name" >/dev/null
  out="$(in_image "$name" "${USER_OF[$name]}" "$binary" --version)" || die "$binary --version failed in its image"
  [[ "$out" == "$binary $VERSION" ]] || die "$binary --version printed '$out'"
  log "$name: '$out' from the image's files as ${USER_OF[$name]}"
done
operator_help="$(in_image operator "${USER_OF[operator]}" teifleet-operator --help)"
grep -qF "$REGISTRY/multiplexer:$VERSION" <<<"$operator_help" ||
  die "the operator's default --multiplexer-image is not $REGISTRY/multiplexer:$VERSION"
grep -qF "$REGISTRY/job:$VERSION" <<<"$operator_help" || die "the operator's default --job-image is not $REGISTRY/job:$VERSION"

# tei-sim as TEI's container is started: TEI's flags, $HOSTNAME the pod's name, ports 0 so the
# check never collides with anything (the addresses are read from its log).
IN_IMAGE_ENV=(HOSTNAME=bge-small-5d8f7c9b4-x2x7q HUGGINGFACE_HUB_CACHE=/data)
in_image tei-sim "${USER_OF[tei-sim]}" tei-sim --model-id=BAAI/bge-small-en-v1.5 --port=0 --prometheus-port=0 \
  --max-concurrent-requests=2048 --json-output >"$OUT/tei-sim.log" 2>&1 &
PIDS+=($!)
IN_IMAGE_ENV=()
serving=""
for _ in $(seq 100); do
  serving="$(grep -m1 '"TEI simulator serving"' "$OUT/tei-sim.log" || true)"
  [[ -n "$serving" ]] && break
  kill -0 "${PIDS[-1]}" 2>/dev/null || break
  sleep 0.1
done
[[ -n "$serving" ]] || { cat "$OUT/tei-sim.log" >&2; die "tei-sim did not start from its image"; }
grpc_port="$(sed -n 's/.*"addr":"0\.0\.0\.0:\([0-9]*\)".*/\1/p' <<<"$serving")"
metrics_port="$(sed -n 's/.*"admin":"0\.0\.0\.0:\([0-9]*\)".*/\1/p' <<<"$serving")"
[[ -n "$grpc_port" && -n "$metrics_port" ]] || die "tei-sim should listen on 0.0.0.0 as TEI does: $serving"
# The kubelet's gRPC probe, by hand: grpc.health.v1.Health/Check with an empty request; the answer
# is one message, status SERVING (field 1 = 1).
answer="$(printf '\0\0\0\0\0' | curl -sS --max-time 5 --http2-prior-knowledge -H 'content-type: application/grpc' \
  -H 'te: trailers' --data-binary @- "http://127.0.0.1:$grpc_port/grpc.health.v1.Health/Check" | od -An -tx1 | tr -d ' \n')"
[[ "$answer" == 00000000020801 ]] || die "tei-sim's gRPC health check answered '$answer', not SERVING"
metrics="$(curl -sfS --max-time 5 "http://127.0.0.1:$metrics_port/metrics")" ||
  die "tei-sim's /metrics does not answer on the Prometheus port"
grep -q '^te_request_count ' <<<"$metrics" || die "tei-sim's /metrics lacks TEI's te_request_count"
log "tei-sim: gRPC health SERVING on :$grpc_port and /metrics on :$metrics_port, started with TEI's flags"

# --- Push the images and the chart, as the release workflow does --------------------------------

start_local_registry "$CRANE" "$OUT/registry.log" || die "crane's local registry did not start"
PIDS+=("$REGISTRY_PID")
port="$REGISTRY_PORT"
REGISTRY="127.0.0.1:$port/teifleet" "$ROOT/images/push.sh" --out "$OUT/a" >"$OUT/pushed.txt" 2>"$OUT/push.log" ||
  { cat "$OUT/push.log" >&2; die "pushing to a local registry failed"; }
[[ "$(wc -l <"$OUT/pushed.txt")" == 5 ]] || die "push did not report five images"
grep -qF "\"org.opencontainers.image.version\":\"$VERSION\"" <<<"$("$CRANE" config "127.0.0.1:$port/teifleet/operator:$VERSION")" ||
  die "the pushed operator image does not read back"
log "pushed to a local registry with the digests that were built: $(tr '\n' ' ' <"$OUT/pushed.txt")"
CHART_REGISTRY="oci://127.0.0.1:$port/teifleet/charts" HELM_FLAGS=--plain-http \
  "$ROOT/images/push-chart.sh" --out "$OUT/a" >"$OUT/chart-pushed.txt"
log "chart pushed and read back: $(cat "$OUT/chart-pushed.txt")"
log "ok"
