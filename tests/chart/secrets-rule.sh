#!/usr/bin/env bash
# Fails unless every mention of Secrets in a rendered chart ($1) is the one rule the operator
# needs: create, in the core group, alone. The operator creates each pool's peer Secret and must
# never read, list, watch or update one, so a rule in any other shape (other verbs, block-style
# lists, Secrets beside other resources) is refused rather than parsed.
set -euo pipefail
file=$1
space='[[:space:]]*'
# A list item "secrets", in block (- secrets) or flow ([a, "secrets"]) style, quoted or not.
mention="(^${space}-${space}|[[,]${space})[\"']?secrets[\"']?${space}(\$|[],])"
group="^${space}-${space}apiGroups:${space}\\[\"\"\\]${space}\$"
resources="^${space}resources:${space}\\[\"secrets\"\\]${space}\$"
verbs="^${space}verbs:${space}\\[\"create\"\\]${space}\$"
mapfile -t lines <"$file"
bad=0
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
if ((bad)); then
  echo "the chart's RBAC may grant Secrets only as - apiGroups: [\"\"] / resources: [\"secrets\"] / verbs: [\"create\"]:" >&2
  echo "the operator creates peer Secrets and never reads one (sidecar Roles get theirs, by name, through escalate and bind)" >&2
  exit 1
fi
