{{/* Names and labels shared by every template. */}}

{{- define "pagedkube.name" -}}
pagedkube
{{- end }}

{{/* <release>-pagedkube, or just <release> when it already says pagedkube; 63-char DNS label. */}}
{{- define "pagedkube.fullname" -}}
{{- if contains "pagedkube" .Release.Name -}}
{{- .Release.Name | trunc 54 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-pagedkube" .Release.Name | trunc 54 | trimSuffix "-" -}}
{{- end -}}
{{- end }}

{{- define "pagedkube.operatorName" -}}
{{- printf "%s-operator" (include "pagedkube.fullname" .) -}}
{{- end }}

{{- define "pagedkube.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "pagedkube.operatorName" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end }}

{{- define "pagedkube.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pagedkube.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "pagedkube.labels" -}}
{{ include "pagedkube.selectorLabels" . }}
{{ include "pagedkube.commonLabels" . }}
{{- end }}

{{/* Labels of every object, without a component (selectorLabels adds the operator's). */}}
{{- define "pagedkube.commonLabels" -}}
app.kubernetes.io/part-of: pagedkube
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{- define "pagedkube.image" -}}
{{- $tag := default .Chart.AppVersion .Values.operator.image.tag -}}
{{- if hasPrefix "sha256:" $tag -}}
{{- printf "%s@%s" .Values.operator.image.repository $tag -}}
{{- else if hasPrefix "@" $tag -}}
{{- printf "%s%s" .Values.operator.image.repository $tag -}}
{{- else -}}
{{- printf "%s:%s" .Values.operator.image.repository $tag -}}
{{- end -}}
{{- end }}
