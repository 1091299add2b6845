#!/usr/bin/env bash
# Prints teifleet-rules.yaml wrapped in a prometheus-operator PrometheusRule, for clusters whose
# Prometheus reads rules from those (kube-prometheus-stack and the like); the rules stay in one
# file. Usage: deploy/prometheus/prometheusrule.sh [NAMESPACE [LABEL=VALUE ...]] | kubectl apply -f -
# The labels are what your Prometheus's ruleSelector matches (kube-prometheus-stack: release=<its
# Helm release>). tests/observability/run.sh checks that the wrapped groups are the file's.
set -euo pipefail
namespace=${1:-monitoring}
shift || true
printf '%s\n' "apiVersion: monitoring.coreos.com/v1" "kind: PrometheusRule" "metadata:" "  name: teifleet" \
    "  namespace: $namespace" "  labels:" "    app.kubernetes.io/name: teifleet"
for label in "$@"; do
    [[ $label == *=* ]] || { echo "labels are LABEL=VALUE, not $label" >&2; exit 2; }
    printf '    %s: "%s"\n' "${label%%=*}" "${label#*=}"
done
echo "spec:"
sed -n '/^groups:/,$p' "$(dirname "$0")/teifleet-rules.yaml" | sed 's/^/  /'
