{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "prefixfleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: release-chart unless the release name already contains the chart name. */}}
{{- define "prefixfleet.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "prefixfleet.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "prefixfleet.labels" -}}
helm.sh/chart: {{ include "prefixfleet.chart" . | quote }}
app.kubernetes.io/name: {{ include "prefixfleet.name" . | quote }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
{{- end }}

{{/* Selector of the operator pod (component keeps it apart from Redis and the fleets' pods). */}}
{{- define "prefixfleet.operatorSelectorLabels" -}}
app.kubernetes.io/name: {{ include "prefixfleet.name" . | quote }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "prefixfleet.redisSelectorLabels" -}}
app.kubernetes.io/name: {{ include "prefixfleet.name" . | quote }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/component: redis
{{- end }}

{{- define "prefixfleet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "prefixfleet.fullname" .) .Values.serviceAccount.name }}
{{- else if .Values.serviceAccount.name }}
{{- .Values.serviceAccount.name }}
{{- else }}
{{- /* Not the namespace's "default" ServiceAccount: every pod of the namespace that names none runs
       as it, and would get the operator's rights (cluster-wide pods, Secrets) with it. */}}
{{- fail "serviceAccount.create=false needs serviceAccount.name: the ServiceAccount you made for the operator (the chart binds its roles to it; falling back to the namespace's default ServiceAccount would give them to every pod there)" }}
{{- end }}
{{- end }}

{{- define "prefixfleet.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "prefixfleet.redisName" -}}
{{- printf "%s-redis" (include "prefixfleet.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The Redis URL fleets fall back to: explicit value, else the chart's own Redis, else none. */}}
{{- define "prefixfleet.defaultRedisUrl" -}}
{{- if .Values.operator.defaultRedisUrl }}
{{- .Values.operator.defaultRedisUrl }}
{{- else if .Values.redis.enabled }}
{{- printf "redis://%s.%s.svc:%d/0" (include "prefixfleet.redisName" .) .Release.Namespace (int .Values.redis.port) }}
{{- end }}
{{- end }}

{{/* Restricted pod security: what every container of this chart runs with. */}}
{{- define "prefixfleet.containerSecurityContext" -}}
runAsNonRoot: true
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* A duration as values.schema.json admits it (1m30s, 500ms: numbers with ms, s, m or h), in
     milliseconds, to compare two of them (Helm has no duration parser). */}}
{{- define "prefixfleet.durationMs" -}}
{{- $units := dict "ms" 1 "s" 1000 "m" 60000 "h" 3600000 }}
{{- $total := 0 }}
{{- range regexFindAll "[0-9]+(ms|s|m|h)" . -1 }}
{{- $total = add $total (mul (regexFind "^[0-9]+" . | atoi) (get $units (regexReplaceAll "^[0-9]+" . ""))) }}
{{- end }}
{{- $total }}
{{- end }}

{{- /* The operator's environment: the chart's variables, then operator.extraEnv, which replaces the
       chart's of a name it sets (Helm 4's server-side apply refuses a name listed twice). */}}
{{- define "prefixfleet.operatorEnv" -}}
{{- $extra := dict }}
{{- $extraEnv := list }}
{{- range .Values.operator.extraEnv }}
{{- if hasKey $extra .name }}
{{- fail (printf "operator.extraEnv: %q is set twice; give each variable once" .name) }}
{{- end }}
{{- $_ := set $extra .name true }}
{{- /* An EnvVar's value is a string, but `--set ...value=30` and a values file's `value: true` give a
       number or a boolean, which the API server refuses: render the text written (toJson: 1000000,
       not toString's 1e+06). A null value and valueFrom entries stay as they are. */}}
{{- $entry := . }}
{{- if and (hasKey . "value") (not (kindIs "string" .value)) (not (kindIs "invalid" .value)) }}
{{- $entry = set (deepCopy .) "value" (toJson .value) }}
{{- end }}
{{- $extraEnv = append $extraEnv $entry }}
{{- end }}
{{- $own := list
  (dict "name" "PYTHONDONTWRITEBYTECODE" "value" "1")
  (dict "name" "PYTHONUNBUFFERED" "value" "1")
  (dict "name" "POD_NAMESPACE" "valueFrom" (dict "fieldRef" (dict "fieldPath" "metadata.namespace")))
  (dict "name" "PREFIXFLEET_IMAGE" "value" (include "prefixfleet.image" .)) }}
{{- with (include "prefixfleet.defaultRedisUrl" .) }}
{{- $own = append $own (dict "name" "PREFIXFLEET_REDIS_URL" "value" .) }}
{{- end }}
{{- with .Values.operator.defaultPrometheusUrl }}
{{- $own = append $own (dict "name" "PREFIXFLEET_PROMETHEUS_URL" "value" .) }}
{{- end }}
{{- $env := list }}
{{- range $own }}
{{- if not (hasKey $extra .name) }}
{{- $env = append $env . }}
{{- end }}
{{- end }}
{{- toYaml (dict "env" (concat $env $extraEnv)) }}
{{- end }}

{{/* A valkey memory size as values.schema.json admits it (256mb, 1GB, 512m, 300000000: b, k, kb, m,
     mb, g, gb in any case; k/m/g are powers of 1000, kb/mb/gb of 1024), in bytes. */}}
{{- define "prefixfleet.valkeyBytes" -}}
{{- $v := lower (toString .) }}
{{- $units := dict "" 1.0 "b" 1.0 "k" 1000.0 "kb" 1024.0 "m" 1000000.0 "mb" 1048576.0 "g" 1000000000.0 "gb" 1073741824.0 }}
{{- mulf (regexFind "^[0-9]+" $v | float64) (get $units (regexReplaceAll "^[0-9]+" $v "")) }}
{{- end }}

{{/* A Kubernetes quantity (384Mi, 1.5Gi, 1G, 100000000) in bytes; empty for a form it does not read
     (an exponent: 1e9), which is then not compared. */}}
{{- define "prefixfleet.quantityBytes" -}}
{{- $q := toString . }}
{{- $number := "^([0-9]+([.][0-9]*)?|[.][0-9]+)" }}
{{- if regexMatch (printf "%s(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$" $number) $q }}
{{- $units := dict "" 1.0 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "P" 1e15 "E" 1e18 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "Pi" 1125899906842624.0 "Ei" 1152921504606846976.0 }}
{{- mulf (regexFind $number $q | float64) (get $units (regexReplaceAll $number $q "")) }}
{{- end }}
{{- end }}
