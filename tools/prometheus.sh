#!/usr/bin/env bash
# Prints the path of a Prometheus server with Kubernetes service discovery, building it once per
# version from the Go module proxy into a cache outside the repository:
#
#   prometheus=$(tools/prometheus.sh)
#
# Debian's prometheus package (promtool, and the loopback server of tests/observability/run.sh) is
# built without Kubernetes service discovery (`kubernetes_sd_configs` is an unknown field there),
# so tests/e2e/tests/real_pods.rs, which scrapes the real node's pods as an adopter's Prometheus
# does, runs this upstream build. Only the Kubernetes plugin is compiled in (`remove_all_sd`,
# `enable_kubernetes_sd`), and no web UI assets: the HTTP API is all the test reads. The module
# has `exclude` directives, which `go install module@version` refuses, so it is built as the main
# module with its own go.sum (GOWORK=off: its go.work names modules the zip lacks). A few minutes
# of CPU the first time; the cache is keyed by the version below (Prometheus 3.x's Go module versions are v0.3xx.y).
set -euo pipefail
PROMETHEUS_VERSION=v0.316.0
MODULE=github.com/prometheus/prometheus
CACHE="${TEIFLEET_CACHE:-$HOME/.cache/teifleet}"
out="$CACHE/prometheus-$PROMETHEUS_VERSION/prometheus"
if [[ ! -x "$out" ]]; then
  command -v go >/dev/null 2>&1 || { echo "[prometheus] Go is required to build prometheus" >&2; exit 1; }
  echo "[prometheus] building prometheus $PROMETHEUS_VERSION (Kubernetes discovery only) into $out (once per version)" >&2
  # Go's caches of this build go with it (read again only for a new version), unless
  # tests/cluster/prereqs.sh made the caches every tool it builds shares (TEIFLEET_GO_SCRATCH).
  if [[ -z "${TEIFLEET_GO_SCRATCH:-}" ]]; then
    scratch=$(mktemp -d)
    trap 'chmod -R u+w "$scratch" 2>/dev/null || true; rm -rf "$scratch"' EXIT
    export GOCACHE="$scratch/build" GOMODCACHE="$scratch/mod" GOFLAGS="${GOFLAGS:-} -modcacherw"
  fi
  dir=$(go mod download -json "$MODULE@$PROMETHEUS_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [[ -d "$dir" ]] || { echo "[prometheus] could not download $MODULE@$PROMETHEUS_VERSION" >&2; exit 1; }
  mkdir -p "$(dirname "$out")"
  (cd "$dir" && GOWORK=off go build -trimpath -ldflags=-s -tags remove_all_sd,enable_kubernetes_sd -o "$out.partial" ./cmd/prometheus)
  mv "$out.partial" "$out"
fi
echo "$out"
