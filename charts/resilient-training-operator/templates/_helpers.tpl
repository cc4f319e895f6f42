{{/* Chart name, truncated to 63 characters (a DNS label). */}}
{{- define "rtj.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Fully qualified release name. */}}
{{- define "rtj.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "rtj.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels: stable across upgrades (never add version labels here). */}}
{{- define "rtj.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rtj.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Standard labels on every object. */}}
{{- define "rtj.labels" -}}
helm.sh/chart: {{ include "rtj.chart" . }}
{{ include "rtj.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: resilient-training-operator
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "rtj.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "rtj.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "rtj.leaseName" -}}
{{- default (include "rtj.fullname" .) .Values.leaderElection.leaseName -}}
{{- end -}}

{{- define "rtj.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- if .Values.image.digest -}}
{{- printf "%s:%s@%s" .Values.image.repository $tag .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{- define "rtj.resolverImage" -}}
{{- $r := .Values.resolverImage -}}
{{- if $r.repository -}}
{{- $tag := $r.tag | default .Chart.AppVersion -}}
{{- if $r.digest -}}
{{- printf "%s:%s@%s" $r.repository $tag $r.digest -}}
{{- else -}}
{{- printf "%s:%s" $r.repository $tag -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Whether the cluster serves a monitoring.coreos.com/v1 kind (Prometheus Operator). */}}
{{- define "rtj.hasMonitoring" -}}
{{- if .Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" .kind) -}}true{{- end -}}
{{- end -}}
