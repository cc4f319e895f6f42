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

{{/* The operator's rules in the namespaces its jobs live in (docs/operations.md, Permissions:
the rows of scope "job namespaces"): the ClusterRole's when every namespace is watched, a Role
in each of operator.watchNamespaces otherwise. Exactly what the code calls there, nothing more. */}}
{{- define "rtj.jobRules" -}}
# the jobs: listed and watched (kopf, the resync, the claim sweep's fresh LIST); get + patch
# only to add/remove the finalizer that releases a job's node quarantines; delete only
# spec.ttlSecondsAfterFinished after a job finished (uid precondition)
- apiGroups: ["training.resilient.dev"]
  resources: ["resilienttrainingjobs"]
  verbs: ["get", "list", "watch", "patch", "delete"]
# the operator's status: one merge patch per decision through the status subresource
- apiGroups: ["training.resilient.dev"]
  resources: ["resilienttrainingjobs/status"]
  verbs: ["patch"]
# attempt JobSets carry an ownerReference with blockOwnerDeletion to their job
# (needed where the OwnerReferencesPermissionEnforcement admission plugin is on)
- apiGroups: ["training.resilient.dev"]
  resources: ["resilienttrainingjobs/finalizers"]
  verbs: ["update"]
# one JobSet per attempt: created, listed and watched, deleted (never edited)
- apiGroups: ["jobset.x-k8s.io"]
  resources: ["jobsets"]
  verbs: ["list", "watch", "create", "delete"]
# worker pods: listed and watched; orphans of a deleted attempt are deleted
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "delete"]
# decision Events on the job; the pod, JobSet and Kueue Workload Events the classifier reads,
# kept from a watch (rtj_operator/event_watch.py)
- apiGroups: [""]
  resources: ["events"]
  verbs: ["list", "watch", "create"]
# the job's Kueue LocalQueue, looked up by name while an attempt waits for admission
# (a missing queue becomes the Admitted=False reason LocalQueueNotFound)
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["localqueues"]
  verbs: ["get"]
{{- if .Values.rbac.readCheckpointSecrets }}
# spec.checkpoint.credentialsSecretRef, read by name in the job's namespace (no list/watch:
# secrets are never enumerated)
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
{{- end }}
{{- if .Values.operator.inPlaceRestart.enabled }}
# each job's key Secret (rtj-control-<job uid>, owned by the job), created before its first
# JobSet: the pods read their key from it, so no pod template holds it (never read back,
# updated or deleted: the garbage collector deletes it with its job)
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create"]
{{- end }}
{{- end -}}
