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
