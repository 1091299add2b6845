#!/usr/bin/env bash
# Fails unless every mention of Secrets and of ConfigMaps in a rendered chart ($1) is the one rule
# the operator needs for each: create, in the core group, alone. The operator creates each pool's
# peer Secret and each EmbeddingJob's progress ConfigMap, and must never read, list, watch or
# update either kind cluster-wide (what it reads, it reads by name through namespaced Roles it
# writes with escalate and bind), so a rule in any other shape (other verbs, block-style lists,
# these kinds beside other resources) is refused rather than parsed.
set -euo pipefail
file=$1
space='[[:space:]]*'
group="^${space}-${space}apiGroups:${space}\\[\"\"\\]${space}\$"
verbs="^${space}verbs:${space}\\[\"create\"\\]${space}\$"
mapfile -t lines <"$file"
bad=0
for kind in secrets configmaps; do
  # A list item naming the kind, in block (- secrets) or flow ([a, "secrets"]) style, quoted or not.
  mention="(^${space}-${space}|[[,]${space})[\"']?${kind}[\"']?${space}(\$|[],])"
  resources="^${space}resources:${space}\\[\"${kind}\"\\]${space}\$"
  for i in "${!lines[@]}"; do
    [[ ${lines[i]} =~ $mention ]] || continue
    previous=${lines[i - 1]:-}
    next=${lines[i + 1]:-}
    if ((i > 0)) && [[ $previous =~ $group && ${lines[i]} =~ $resources && $next =~ $verbs ]]; then
      continue
    fi
    echo "$file:$((i + 1)): ${lines[i]}" >&2
    bad=1
  done
done
if ((bad)); then
  echo "the chart's RBAC may grant Secrets and ConfigMaps only as - apiGroups: [\"\"] / resources: [\"secrets\"] (or [\"configmaps\"]) / verbs: [\"create\"]:" >&2
  echo "the operator creates peer Secrets and progress ConfigMaps and never reads one with its own role (sidecar, worker and progress reader Roles get theirs, by name, through escalate and bind)" >&2
  exit 1
fi
