{{- define "teifleet.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "teifleet.operatorName" -}}
{{- printf "%s-operator" (include "teifleet.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "teifleet.serviceAccountName" -}}
{{- default (include "teifleet.operatorName" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "teifleet.selectorLabels" -}}
app.kubernetes.io/name: teifleet-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "teifleet.labels" -}}
{{ include "teifleet.selectorLabels" . }}
app.kubernetes.io/part-of: teifleet
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- /* The OpenAI Batch API (teifleet-batch), when batch.enabled. */ -}}
{{- define "teifleet.batchName" -}}
{{- printf "%s-batch" (include "teifleet.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "teifleet.batchSelectorLabels" -}}
app.kubernetes.io/name: teifleet-batch
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "teifleet.batchLabels" -}}
{{ include "teifleet.batchSelectorLabels" . }}
app.kubernetes.io/component: batch-api
app.kubernetes.io/part-of: teifleet
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- /* Where the server mounts its store's claim, and the auth Secret. */ -}}
{{- define "teifleet.batchStoreMount" -}}/data/batch{{- end -}}
{{- define "teifleet.batchKeysMount" -}}/var/run/teifleet/api-keys{{- end -}}

{{- /*
The store, checked: exactly one of a claim or a bucket. Prints "pvc" or "s3"; fails otherwise, in
words, at install time rather than in a crash-looping pod.
*/ -}}
{{- define "teifleet.batchStoreKind" -}}
{{- $store := .Values.batch.store -}}
{{- $pvc := and $store.pvc $store.pvc.claimName -}}
{{- $s3 := and $store.s3 $store.s3.bucket -}}
{{- if and $pvc $s3 -}}
{{- fail "batch.store: set one of batch.store.pvc.claimName and batch.store.s3.bucket, not both" -}}
{{- else if $pvc -}}
pvc
{{- else if $s3 -}}
{{- if not $store.s3.endpoint -}}
{{- fail "batch.store.s3.endpoint must be the S3 API's URL, e.g. https://s3.us-east-1.amazonaws.com" -}}
{{- end -}}
{{- if not $store.s3.credentialsSecret -}}
{{- fail "batch.store.s3.credentialsSecret must name the Secret (keys accessKeyId and secretAccessKey) the server and the batches' workers use" -}}
{{- end -}}
{{- if and (hasPrefix "http://" $store.s3.endpoint) (not $store.s3.allowHttp) -}}
{{- fail "batch.store.s3.endpoint is plain http: set batch.store.s3.allowHttp=true to send the credentials unencrypted" -}}
{{- end -}}
s3
{{- else -}}
{{- fail "batch.enabled needs a store for its files and its batches' output: batch.store.pvc.claimName or batch.store.s3.bucket" -}}
{{- end -}}
{{- end -}}

{{- /* Path segments joined with "/", empty ones left out: "a/", "/b" -> "a/b". */ -}}
{{- define "teifleet.joinPath" -}}
{{- $segments := list -}}
{{- range . -}}
{{- range (splitList "/" .) -}}
{{- if . -}}{{- $segments = append $segments . -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- join "/" $segments -}}
{{- end -}}

{{- /* The server's --store: the claim's directory as mounted, or the bucket's prefix; always a directory. */ -}}
{{- define "teifleet.batchStoreUrl" -}}
{{- $store := .Values.batch.store -}}
{{- if eq (include "teifleet.batchStoreKind" .) "pvc" -}}
{{- $path := include "teifleet.joinPath" (list $store.pvc.path) -}}
{{- printf "file://%s/%s" (include "teifleet.batchStoreMount" .) (ternary "" (printf "%s/" $path) (eq $path "")) -}}
{{- else -}}
{{- $key := include "teifleet.joinPath" (list $store.s3.key) -}}
{{- printf "s3://%s/%s" $store.s3.bucket (ternary "" (printf "%s/" $key) (eq $key "")) -}}
{{- end -}}
{{- end -}}
