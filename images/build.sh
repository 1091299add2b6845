#!/usr/bin/env bash
# Builds teifleet's OCI images from already built binaries, without a Docker engine:
#
#   images/build.sh [--bin-dir target/release] [--out target/images]
#
# Each image is two layers on an empty base, in the distroless manner:
#   1. base (the same in every image): the shared libraries the binaries load (found with ldd) and
#      the CA certificates, taken from the Debian packages that provide them (apt-get download of
#      the installed versions, or of the same release's current ones once Debian's archive has
#      moved on, + dpkg-deb -x), /etc/os-release, the packages' copyright files and dpkg entries,
#      /etc/passwd and /etc/group with the non-root users, /tmp; no shell, no package manager;
#   2. the binary, in /usr/local/bin, as the entrypoint.
# Layers are tarred with sorted entries, uid/gid 0 and every mtime at SOURCE_DATE_EPOCH (the
# commit's time), so two builds of one commit give the same digests. crane (images/install-tools.sh)
# assembles each image in a throwaway registry on 127.0.0.1 and writes it as a docker-archive
# tarball with its tag, which `docker load`, `ctr images import` and `kind load image-archive` take.
#
# Environment: REGISTRY (default ghcr.io/teifleet), VERSION (default: the crate version),
# SOURCE_DATE_EPOCH (default: the commit time of HEAD), REVISION (default: HEAD's commit, with
# -dirty when tracked files differ from it), CRANE (default: installed on demand).
# Writes <out>/<name>.tar and <out>/images.txt ("name reference digest bytes" per line).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=images/lib.sh
. "$ROOT/images/lib.sh"
BIN_DIR="$ROOT/target/release"
OUT="$ROOT/target/images"
while (($#)); do
  case "$1" in
    --bin-dir) BIN_DIR="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    *) echo "usage: $0 [--bin-dir DIR] [--out DIR]" >&2; exit 2 ;;
  esac
done

log() { echo "[images] $*" >&2; }
die() { log "error: $*"; exit 1; }

# name, binary, user, exposed ports (- for none). The users match where each runs: the chart runs
# the operator as 65532 and the batch API (batch) as 1000, the user of the EmbeddingJob workers that
# share its store; the operator renders TEI pods (the multiplexer, and tei-sim standing in for TEI)
# and EmbeddingJob workers (job, which listens on nothing) as 1000.
IMAGES=(
  "operator teifleet-operator 65532:65532 8080/tcp"
  "multiplexer teifleet-multiplexer 1000:1000 50051/tcp,9090/tcp"
  "tei-sim tei-sim 1000:1000 80/tcp,9000/tcp"
  "job teifleet-job 1000:1000 -"
  "batch teifleet-batch 1000:1000 8080/tcp"
)

CACHE="${TEIFLEET_CACHE:-$HOME/.cache/teifleet}"
CRANE="${CRANE:-$("$ROOT/images/install-tools.sh")}"
REGISTRY="${REGISTRY:-ghcr.io/teifleet}"
VERSION="${VERSION:-$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$ROOT/Cargo.toml")}"
SOURCE_URL="$(sed -n '/^\[workspace.package\]/,/^\[/s/^repository = "\(.*\)"/\1/p' "$ROOT/Cargo.toml")"
LICENSE="$(sed -n '/^\[workspace.package\]/,/^\[/s/^license = "\(.*\)"/\1/p' "$ROOT/Cargo.toml")"
[[ -n "$VERSION" && -n "$SOURCE_URL" ]] || die "cannot read the version and repository from Cargo.toml"
if [[ -z "${REVISION:-}" || -z "${SOURCE_DATE_EPOCH:-}" ]]; then
  git -C "$ROOT" rev-parse HEAD >/dev/null 2>&1 || die "not a git checkout: set REVISION and SOURCE_DATE_EPOCH"
fi
if [[ -z "${REVISION:-}" ]]; then
  REVISION="$(git -C "$ROOT" rev-parse HEAD)"
  # A tree with uncommitted changes to tracked files is not what the commit says it is.
  git -C "$ROOT" diff --quiet HEAD -- 2>/dev/null || REVISION="$REVISION-dirty"
fi
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git -C "$ROOT" log -1 --format=%ct)}"
CREATED="$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)"
ARCH="$(dpkg --print-architecture)"

for image in "${IMAGES[@]}"; do
  read -r _ binary _ <<<"$image"
  [[ -x "$BIN_DIR/$binary" ]] || die "$BIN_DIR/$binary is missing: cargo build --release --locked -p <crate>"
done

mkdir -p "$OUT"
# Private scratch space: nothing another build, or a cleanup of target/, can touch half-way.
WORK="$(mktemp -d "${TMPDIR:-/tmp}/teifleet-images.XXXXXX")"
REGISTRY_PID=""
cleanup() {
  if [[ -n "$REGISTRY_PID" ]]; then kill "$REGISTRY_PID" 2>/dev/null || true; wait "$REGISTRY_PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

# Runs a command with its chatter in a log, shown only when it fails.
quiet() {
  local log="$WORK/command.log"
  if ! "$@" >"$log" 2>&1; then
    cat "$log" >&2
    die "failed: $*"
  fi
}

# --- What the binaries load, and which Debian package provides each file --------------------------

# The package that installed $1 (ldd may print a path through the /lib -> usr/lib link).
owner() {
  local path="$1" candidate
  for candidate in "$path" "${path#/usr}" "/usr$path" "$(readlink -f "$path")"; do
    if dpkg-query -S "$candidate" >/dev/null 2>&1; then
      dpkg-query -S "$candidate" | sed -n '1s/: .*//p'
      echo "$candidate"
      return
    fi
  done
}

declare -A PACKAGES=() # the set of package[:arch] to take files from
declare -a LIB_FILES=() # "package path" pairs
for image in "${IMAGES[@]}"; do
  read -r _ binary _ <<<"$image"
  ldd_out="$(ldd "$BIN_DIR/$binary" 2>&1)" || die "ldd $binary failed: $ldd_out"
  grep -q 'not found' <<<"$ldd_out" && die "$binary needs libraries this machine lacks:"$'\n'"$ldd_out"
  # Lines are "name => /path (addr)" or "/path (addr)" (the loader); the vDSO has no file.
  while read -r path; do
    mapfile -t found < <(owner "$path")
    ((${#found[@]} == 2)) || die "no Debian package owns $path, which $binary loads (only Debian's libraries can be shipped)"
    PACKAGES["${found[0]}"]=1
    LIB_FILES+=("${found[0]} ${found[1]}")
  done < <(sed -n 's/.*=> \(\/[^ ]*\) (.*/\1/p; s/^[[:space:]]*\(\/[^ ]*\) (.*/\1/p' <<<"$ldd_out" | sort -u)
done
PACKAGES[ca-certificates]=1
# /etc/os-release and /etc/debian_version, so scanners know which distribution's fixes apply.
PACKAGES[base-files]=1

# --- The packages: the installed versions, downloaded once and cached ----------------------------

download() { # package[:arch] version -> path of the .deb
  local package="$1" version="$2" dir
  dir="$CACHE/debs/${package%%:*}/$version"
  if ! compgen -G "$dir/*.deb" >/dev/null; then
    log "apt-get download $package=$version"
    local tmp; tmp="$(mktemp -d "$WORK/download.XXXXXX")"
    local apt=(apt-get -q)
    # As root, apt drops to the _apt user, which cannot write to a private temporary directory.
    [[ "$(id -u)" == 0 ]] && apt+=(-o APT::Sandbox::User=root)
    if ! (cd "$tmp" && "${apt[@]}" download "$package=$version" >"$WORK/apt.log" 2>&1); then
      cat "$WORK/apt.log" >&2
      die "cannot download $package=$version from Debian's archive (run apt-get update; is the mirror reachable?)"
    fi
    mkdir -p "$dir"
    mv "$tmp"/*.deb "$dir/"
  fi
  local debs=("$dir"/*.deb)
  echo "${debs[0]}"
}

declare -a PACKAGE_LABEL=()
declare -A DEB_OF=()
fetch() { # package[:arch]: its installed version, unpacked under $WORK/debs/<package>
  local package="$1" version deb
  [[ -d "$WORK/debs/$package" ]] && return
  version="$(dpkg-query -W -f='${Version}' "$package" 2>/dev/null)" || die "$package is not installed"
  # The installed version is what the binaries were linked and tested against; when Debian's
  # archive has moved on (a point release replaced it), its current version of the same release.
  if ! deb="$(download "$package" "$version" 2>/dev/null)"; then
    local candidate
    candidate="$(apt-cache policy "$package" | sed -n 's/^ *Candidate: //p')"
    [[ -n "$candidate" && "$candidate" != "(none)" ]] || die "Debian's archive has no $package (run apt-get update)"
    log "$package=$version is no longer in Debian's archive; using $candidate"
    version="$candidate"
    deb="$(download "$package" "$version")"
  fi
  mkdir -p "$WORK/debs/$package"
  dpkg-deb -x "$deb" "$WORK/debs/$package"
  DEB_OF["$package"]="$deb"
  PACKAGE_LABEL+=("${package%%:*}=$version")
}
for package in $(printf '%s\n' "${!PACKAGES[@]}" | LC_ALL=C sort); do
  fetch "$package"
done

# --- Layer 1: the base ------------------------------------------------------------------------

BASE="$WORK/rootfs-base"
mkdir -p "$BASE"

# Copies $2 from package $1's files into the base, and whatever a symlink on the way points to.
copy_from_package() {
  local tree="$WORK/debs/$1" path="$2"
  [[ -e "$tree$path" || -L "$tree$path" ]] || die "$1 does not ship $path"
  (cd "$tree" && cp -P --parents ".$path" "$BASE/")
  if [[ -L "$tree$path" ]]; then
    local target; target="$(readlink "$tree$path")"
    [[ "$target" == /* ]] || target="$(dirname "$path")/$target"
    copy_from_package "$1" "$(realpath -m -s "$target")"
  fi
}
for entry in "${LIB_FILES[@]}"; do
  read -r package path <<<"$entry"
  copy_from_package "$package" "$path"
done
copy_from_package base-files /etc/os-release
copy_from_package base-files /etc/debian_version
# Each package's copyright file, as Debian's licences ask. Some packages (libgcc-s1) link their doc
# directory to another package's (gcc-12-base), which is then fetched for its copyright alone.
for package in $(printf '%s\n' "${!PACKAGES[@]}" | LC_ALL=C sort); do
  name="${package%%:*}"
  doc="$WORK/debs/$package/usr/share/doc/$name"
  if [[ -L "$doc" ]]; then
    other="$(basename "$(readlink "$doc")")"
    other_package="$(dpkg-query -W -f='${Package}:${Architecture}\n' "$other" 2>/dev/null | sed -n 1p)"
    [[ -n "$other_package" ]] || die "$package's documentation is in $other, which is not installed"
    [[ "$other_package" == *:all ]] && other_package="$other"
    fetch "$other_package"
    doc="$WORK/debs/$other_package/usr/share/doc/$other"
  fi
  [[ -f "$doc/copyright" ]] || die "no copyright file for $package"
  install -D -m 0644 "$doc/copyright" "$BASE/usr/share/doc/$name/copyright"
done
# What is installed, where image scanners look for it in a distroless image (there is no dpkg
# database): each package's control fields.
mkdir -p "$BASE/var/lib/dpkg/status.d"
for package in "${!DEB_OF[@]}"; do
  { dpkg-deb -f "${DEB_OF[$package]}" | sed '/^Description:/,$d'; echo "Status: install ok installed"; } \
    >"$BASE/var/lib/dpkg/status.d/${package%%:*}"
done

# The bundle update-ca-certificates would write at install time: every certificate the package
# ships, concatenated in name order.
mkdir -p "$BASE/etc/ssl/certs"
while read -r crt; do
  cat "$crt"
  [[ -z "$(tail -c1 "$crt")" ]] || echo
done < <(find "$WORK/debs/ca-certificates/usr/share/ca-certificates" -name '*.crt' | LC_ALL=C sort) \
  >"$BASE/etc/ssl/certs/ca-certificates.crt"
[[ -s "$BASE/etc/ssl/certs/ca-certificates.crt" ]] || die "no CA certificates found in the ca-certificates package"

cat >"$BASE/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
teifleet:x:1000:1000:teifleet:/tmp:/sbin/nologin
nonroot:x:65532:65532:nonroot:/tmp:/sbin/nologin
EOF
cat >"$BASE/etc/group" <<'EOF'
root:x:0:
teifleet:x:1000:
nonroot:x:65532:
EOF
# /etc/hosts before DNS, as glibc does without this file but stated here for readers of the image.
echo "hosts: files dns" >"$BASE/etc/nsswitch.conf"
mkdir -p "$BASE/tmp"

# A layer tarball whose bytes depend only on the files' contents, names, modes and link targets.
layer() { # rootfs out.tar
  local rootfs="$1" out="$2"
  chmod -R u=rwX,go=rX "$rootfs"
  [[ -d "$rootfs/tmp" ]] && chmod 1777 "$rootfs/tmp"
  (cd "$rootfs" && find . -mindepth 1 -printf '%P\n' | LC_ALL=C sort) |
    tar --create --file="$out" --directory="$rootfs" --no-recursion --files-from=- \
      --format=posix --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
      --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner
}
layer "$BASE" "$WORK/base.tar"

# --- Layer 2 and the image ------------------------------------------------------------------------

start_local_registry "$CRANE" "$WORK/registry.log" || die "crane's scratch registry did not start"
SCRATCH="127.0.0.1:$REGISTRY_PORT/scratch"
mkdir -p "$WORK/out"

: >"$WORK/images.txt"
for image in "${IMAGES[@]}"; do
  read -r name binary user ports <<<"$image"
  app="$WORK/rootfs-$name"
  mkdir -p "$app/usr/local/bin"
  cp "$BIN_DIR/$binary" "$app/usr/local/bin/$binary"
  layer "$app" "$WORK/$name.tar"

  ref="$REGISTRY/$name:$VERSION"
  env=(-e PATH=/usr/local/bin:/usr/bin:/bin -e SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt)
  # tei-sim stands in for TEI's image, which sets these two.
  [[ "$name" == tei-sim ]] && env+=(-e HUGGINGFACE_HUB_CACHE=/data -e PORT=80)
  exposed=()
  [[ "$ports" == - ]] || exposed=(--exposed-ports "$ports")
  quiet "$CRANE" append --oci-empty-base -f "$WORK/base.tar" -f "$WORK/$name.tar" -t "$SCRATCH/$name:build"
  # crane's label flag splits on commas: no value below may hold one.
  quiet "$CRANE" mutate "$SCRATCH/$name:build" \
    --set-platform "linux/$ARCH" \
    --entrypoint "/usr/local/bin/$binary" \
    --user "$user" \
    --workdir / \
    "${exposed[@]}" \
    "${env[@]}" \
    -l "org.opencontainers.image.title=$name" \
    -l "org.opencontainers.image.source=$SOURCE_URL" \
    -l "org.opencontainers.image.revision=$REVISION" \
    -l "org.opencontainers.image.version=$VERSION" \
    -l "org.opencontainers.image.created=$CREATED" \
    -l "org.opencontainers.image.licenses=$LICENSE" \
    -l "dev.teifleet.debian-packages=${PACKAGE_LABEL[*]}" \
    -t "$ref" -o "$WORK/out/$name.tar"
  digest="$("$CRANE" digest --tarball "$WORK/out/$name.tar")"
  bytes="$(stat -c %s "$WORK/out/$name.tar")"
  echo "$name $ref $digest $bytes" >>"$WORK/images.txt"
done
# The archives and their list replace the previous ones together, once all are built.
mv "$WORK/images.txt" "$WORK/out/"
for file in "$WORK"/out/*; do mv -f "$file" "$OUT/"; done

log "built from $REVISION (SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH), base: ${PACKAGE_LABEL[*]}"
while read -r name ref digest bytes; do
  awk -v n="$name" -v r="$ref" -v b="$bytes" -v d="$digest" 'BEGIN { printf "%-12s %-38s %6.1f MiB  %s\n", n, r, b / 1048576, d }'
done <"$OUT/images.txt"
