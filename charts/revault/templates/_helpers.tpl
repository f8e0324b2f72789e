{{/* Name prefix of the chart's objects: the release name, with "revault" unless it has it. */}}
{{- define "revault.fullname" -}}
{{- if contains "revault" .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-revault" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "revault.labels" -}}
app.kubernetes.io/name: revault
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "revault.operatorSelector" -}}
app.kubernetes.io/name: revault
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "revault.serviceAccountName" -}}
{{ include "revault.fullname" . }}-operator
{{- end -}}

{{- define "revault.image" -}}
{{- $tag := .image.tag | default .root.Chart.AppVersion -}}
{{- printf "%s:%s" .image.repository $tag -}}
{{- end -}}

{{/* The operator's config file (operator/internal/config). */}}
{{- define "revault.config" -}}
{{- $worker := dict
  "image" (include "revault.image" (dict "image" .Values.worker.image "root" .))
  "imagePullPolicy" .Values.worker.image.pullPolicy
  "command" .Values.worker.command
  "port" .Values.worker.port
  "hostPath" .Values.worker.hostPath
  "logFormat" .Values.worker.logFormat
  "dedupDomain" .Values.worker.dedupDomain
  "priorityClassName" .Values.worker.priorityClassName
  "imagePullSecrets" .Values.imagePullSecrets
  "env" .Values.worker.env -}}
{{- $jobs := dict
  "imagePullPolicy" .Values.jobs.image.pullPolicy
  "resources" .Values.jobs.resources
  "backoffLimit" .Values.jobs.backoffLimit
  "ttlSecondsAfterFinished" .Values.jobs.ttlSecondsAfterFinished
  "activeDeadlineSeconds" .Values.jobs.activeDeadlineSeconds
  "priorityClassName" .Values.jobs.priorityClassName -}}
{{- if .Values.jobs.image.repository -}}
{{- $_ := set $jobs "image" (include "revault.image" (dict "image" .Values.jobs.image "root" .)) -}}
{{- end -}}
{{- $config := dict "namespace" .Release.Namespace "worker" $worker "pools" .Values.worker.pools "jobs" $jobs -}}
{{- with .Values.remote -}}
{{- if .enabled -}}
{{- $remote := dict
  "url" (required "remote.url is required when remote.enabled is true" .url)
  "keySecret" (required "remote.keySecret is required when remote.enabled is true (the key file's Secret; docs/remote.md)" .keySecret)
  "syncInterval" .syncInterval
  "evictAfter" .evictAfter
  "lostNodeTimeout" .lostNodeTimeout
  "behindAfter" .behindAfter -}}
{{- if .endpoint }}{{ $_ := set $remote "endpoint" .endpoint }}{{ end -}}
{{- if .region }}{{ $_ := set $remote "region" .region }}{{ end -}}
{{- if .credentialsSecret }}{{ $_ := set $remote "credentialsSecret" .credentialsSecret }}{{ end -}}
{{- if .objectLockDays }}{{ $_ := set $remote "objectLockDays" .objectLockDays }}{{ end -}}
{{- $_ := set $config "remote" $remote -}}
{{- end -}}
{{- end -}}
{{- with .Values.tls -}}
{{- if .enabled -}}
{{- $tls := dict "certValidity" .certValidity "caValidity" .caValidity "clusterDomain" .clusterDomain -}}
{{- if .secret }}{{ $_ := set $tls "secret" .secret }}{{ end -}}
{{- $_ := set $config "tls" $tls -}}
{{- end -}}
{{- end -}}
{{- toYaml $config -}}
{{- end -}}

{{/* The rules controller-gen generated (files/role.yaml): kind is ClusterRole or Role. */}}
{{- define "revault.generatedRules" -}}
{{- $kind := .kind -}}
{{- range $doc := splitList "\n---\n" (.root.Files.Get (.file | default "files/role.yaml")) -}}
{{- $obj := fromYaml $doc -}}
{{- if and $obj (eq ($obj.kind | default "") $kind) -}}
{{ toYaml $obj.rules }}
{{- end -}}
{{- end -}}
{{- end -}}
