{{/* The EPDDeployment's name: nameOverride, else the release name. */}}
{{- define "epd-deployment.name" -}}
{{- default .Release.Name .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{/* The spec: every spec key present in the values (an empty map counts: `store: {}` means a default store). */}}
{{- define "epd-deployment.spec" -}}
{{- $spec := dict -}}
{{- range $key := list "model" "images" "store" "sharedStorage" "encoder" "prefill" "decode" "proxy" -}}
{{- if and (hasKey $.Values $key) (not (kindIs "invalid" (index $.Values $key))) -}}
{{- $_ := set $spec $key (index $.Values $key) -}}
{{- end -}}
{{- end -}}
{{- toYaml $spec -}}
{{- end -}}
