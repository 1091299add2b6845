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
# has `exclude` directives, which `go install module@version` refuses, so tools/go-main-module.sh
# builds it as the main module. A few minutes of CPU the first time; the cache is keyed by the
# version below (Prometheus 3.x's Go module versions are v0.3xx.y).
set -euo pipefail
PROMETHEUS_VERSION=v0.316.0
exec "$(dirname "${BASH_SOURCE[0]}")/go-main-module.sh" prometheus prometheus github.com/prometheus/prometheus \
  "$PROMETHEUS_VERSION" ./cmd/prometheus -tags remove_all_sd,enable_kubernetes_sd
