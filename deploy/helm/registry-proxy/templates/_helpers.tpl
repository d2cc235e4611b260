{{/* The objects' name: <release>-registry-proxy, or the release's name when it already says registry-proxy. */}}
{{- define "registry-proxy.fullname" -}}
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

{{- define "registry-proxy.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels; pass (dict "root" $ "component" "proxy"). */}}
{{- define "registry-proxy.selectorLabels" -}}
app.kubernetes.io/name: {{ include "registry-proxy.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Every object's labels; pass (dict "root" $ "component" "proxy"). */}}
{{- define "registry-proxy.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{ include "registry-proxy.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- end -}}

{{- define "registry-proxy.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Redis is the metadata store: an external URL, a Secret holding one, or the standalone Redis. */}}
{{- define "registry-proxy.redis" -}}
{{- if or .Values.redis.url .Values.redis.existingSecret .Values.redis.standalone.enabled -}}true{{- end -}}
{{- end -}}

{{/* The Secret holding the metadata secret: an existing one, or the chart's when Redis is used; else none. */}}
{{- define "registry-proxy.metadataSecretName" -}}
{{- if .Values.metadataSecret.existingSecret -}}
{{- .Values.metadataSecret.existingSecret -}}
{{- else if include "registry-proxy.redis" . -}}
{{- printf "%s-metadata" (include "registry-proxy.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "registry-proxy.s3SecretName" -}}
{{- if .Values.s3.existingSecret -}}
{{- .Values.s3.existingSecret -}}
{{- else if or .Values.s3.credentials.accessKeyId .Values.s3.credentials.secretAccessKey -}}
{{- printf "%s-s3" (include "registry-proxy.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* The files the proxy reads, each from a Secret or ConfigMap (an existing one, or the chart's from content). */}}
{{- define "registry-proxy.files" -}}
{{- $fullname := include "registry-proxy.fullname" . -}}
{{- $files := list -}}
{{- with .Values.authTokens -}}
{{- if or .existingSecret .content -}}
{{- $files = append $files (dict "name" "auth-tokens" "env" "REGISTRY_PROXY_AUTH_TOKENS" "kind" "secret" "key" .key "object" (default (printf "%s-auth-tokens" $fullname) .existingSecret) "content" (ternary "" .content (not (empty .existingSecret)))) -}}
{{- end -}}
{{- end -}}
{{- with .Values.policy -}}
{{- if or .existingConfigMap .content -}}
{{- $files = append $files (dict "name" "policy" "env" "REGISTRY_PROXY_POLICY" "kind" "configMap" "key" .key "object" (default (printf "%s-policy" $fullname) .existingConfigMap) "content" (ternary "" .content (not (empty .existingConfigMap)))) -}}
{{- end -}}
{{- end -}}
{{- with .Values.oidcIssuers -}}
{{- if or .existingConfigMap .content -}}
{{- $files = append $files (dict "name" "oidc-issuers" "env" "REGISTRY_PROXY_OIDC_ISSUERS" "kind" "configMap" "key" .key "object" (default (printf "%s-oidc-issuers" $fullname) .existingConfigMap) "content" (ternary "" .content (not (empty .existingConfigMap)))) -}}
{{- end -}}
{{- end -}}
{{- toJson $files -}}
{{- end -}}

{{/* The data volume is one ReadWriteOnce claim: only one pod at a time may hold it. */}}
{{- define "registry-proxy.singleWriter" -}}
{{- if and .Values.persistence.enabled (not (has "ReadWriteMany" .Values.persistence.accessModes)) -}}true{{- end -}}
{{- end -}}

{{- define "registry-proxy.publicUrl" -}}
{{- if .Values.config.publicUrl -}}
{{- .Values.config.publicUrl -}}
{{- else if .Values.ingress.enabled -}}
{{- printf "https://%s/" .Values.ingress.host -}}
{{- end -}}
{{- end -}}

{{- define "registry-proxy.trustedProxies" -}}
{{- if .Values.config.trustedProxies -}}
{{- join "," .Values.config.trustedProxies -}}
{{- else if .Values.ingress.enabled -}}
{{- join "," .Values.ingress.trustedProxies -}}
{{- end -}}
{{- end -}}

{{/* Settings that cannot work together stop the install with one line. */}}
{{- define "registry-proxy.checks" -}}
{{- $several := or (gt (int .Values.replicaCount) 1) .Values.autoscaling.enabled -}}
{{- if and $several (not (include "registry-proxy.redis" .)) -}}
{{- fail "registry-proxy: more than one replica (replicaCount > 1 or autoscaling.enabled) needs Redis: set redis.url, redis.existingSecret or redis.standalone.enabled" -}}
{{- end -}}
{{- if and $several (include "registry-proxy.singleWriter" .) -}}
{{- fail "registry-proxy: more than one replica cannot mount one ReadWriteOnce volume: keep archives in S3 (s3.bucket) with persistence.enabled=false, or use persistence.accessModes=[ReadWriteMany]" -}}
{{- end -}}
{{- end -}}
