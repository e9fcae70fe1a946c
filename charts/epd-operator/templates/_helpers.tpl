{{/* Names, labels and the switches every template shares. */}}

{{- define "epd-operator.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "epd-operator.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Cluster-scoped objects carry the release namespace too: two releases in two namespaces must not collide. */}}
{{- define "epd-operator.clusterName" -}}
{{- printf "%s-%s" .Release.Namespace (include "epd-operator.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "epd-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "epd-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "epd-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "epd-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "epd-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "epd-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: epd
{{- end -}}

{{- define "epd-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Peering is on with more than one replica (one handles resources, the others stand by). */}}
{{- define "epd-operator.peering" -}}
{{- if gt (int .Values.replicaCount) 1 -}}true{{- end -}}
{{- end -}}

{{- define "epd-operator.peeringName" -}}
{{- default (include "epd-operator.fullname" .) .Values.peering.name -}}
{{- end -}}

{{- define "epd-operator.peeringGroups" -}}
{{- if .Values.peering.legacyGroup -}}[kopf.dev, zalando.org]{{- else -}}[kopf.dev]{{- end -}}
{{- end -}}
