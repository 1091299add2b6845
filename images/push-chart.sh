#!/usr/bin/env bash
# Packages the Helm chart and pushes it to an OCI registry, then reads it back:
#
#   CHART_REGISTRY=oci://ghcr.io/teifleet/charts images/push-chart.sh [--out target/images]
#
# The chart lands at $CHART_REGISTRY/teifleet:<chart version>; install it with
#   helm install teifleet $CHART_REGISTRY/teifleet --version <chart version>
# HELM_FLAGS is passed to helm push and helm show (e.g. --plain-http for a local registry).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$ROOT/target/images"
while (($#)); do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    *) echo "usage: CHART_REGISTRY=oci://<host/namespace> $0 [--out DIR]" >&2; exit 2 ;;
  esac
done

log() { echo "[push-chart] $*" >&2; }
die() { log "error: $*"; exit 1; }

[[ "${CHART_REGISTRY:-}" == oci://* ]] || die "set CHART_REGISTRY to an oci:// address, e.g. oci://ghcr.io/<you>/charts"
CHART_REGISTRY="${CHART_REGISTRY%/}"
HELM="${HELM:-${TEIFLEET_CACHE:-$HOME/.cache/teifleet}/current/helm}"
[[ -x "$HELM" ]] || die "helm not found at $HELM: run make prereqs"
read -r -a flags <<<"${HELM_FLAGS:-}"

chart="$ROOT/charts/teifleet"
version="$(sed -n 's/^version: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$chart/Chart.yaml")"
mkdir -p "$OUT/chart"
"$HELM" package "$chart" --destination "$OUT/chart" >/dev/null
package="$OUT/chart/teifleet-$version.tgz"
[[ -s "$package" ]] || die "helm package did not write $package"
"$HELM" push "$package" "$CHART_REGISTRY" "${flags[@]}" >"$OUT/chart/push.log" 2>&1 || {
  cat "$OUT/chart/push.log" >&2
  die "helm push to $CHART_REGISTRY failed"
}
digest="$(sed -n 's/^Digest: *//p' "$OUT/chart/push.log")"
# Read back what was pushed: the registry serves the chart helm would install.
shown="$("$HELM" show chart "$CHART_REGISTRY/teifleet" --version "$version" "${flags[@]}" 2>/dev/null)" || true
grep -q "^version: $version\$" <<<"$shown" || die "$CHART_REGISTRY/teifleet:$version cannot be read back"
echo "$CHART_REGISTRY/teifleet:$version@$digest"
