{{/* Names are cut to 63 characters because some Kubernetes name fields are DNS labels. */}}
{{- define "tpujob-operator.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tpujob-operator.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "tpujob-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tpujob-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "tpujob-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "tpujob-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tpujob
{{- end }}

{{- define "tpujob-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "tpujob-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "tpujob-operator.image" -}}
{{- /* `--set image.tag=20261130` arrives as an integer (helm keeps 1.10 a string). */}}
{{- printf "%s:%s" .Values.image.repository (toString (default .Chart.AppVersion .Values.image.tag)) }}
{{- with .Values.image.digest }}@{{ . }}{{ end }}
{{- end }}
