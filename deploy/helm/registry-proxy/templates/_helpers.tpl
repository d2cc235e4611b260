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

{{/* What a pod of the chart runs as: the service account (IRSA / workload identity for S3), the pull secrets,
the non-root security context. The proxy's pods and the `helm test` doctor share it. */}}
{{- define "registry-proxy.podAccess" -}}
automountServiceAccountToken: false
{{- if .Values.serviceAccount.create }}
serviceAccountName: {{ default (include "registry-proxy.fullname" .) .Values.serviceAccount.name }}
{{- else if .Values.serviceAccount.name }}
serviceAccountName: {{ .Values.serviceAccount.name }}
{{- end }}
{{- with .Values.image.pullSecrets }}
imagePullSecrets:
  {{- range . }}
  - name: {{ . }}
  {{- end }}
{{- end }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- end -}}

{{/* The proxy's settings, as a container takes them: the settings ConfigMap, the variables from Secrets and
extraEnv; then ("registry-proxy.settingsMounts") the data dir and the files. The proxy's container and the
`helm test` doctor share them. */}}
{{- define "registry-proxy.settingsEnv" -}}
{{- $s3Secret := include "registry-proxy.s3SecretName" . -}}
{{- $redisSecret := and .Values.redis.existingSecret (not .Values.redis.standalone.enabled) -}}
envFrom:
  - configMapRef:
      name: {{ include "registry-proxy.fullname" . }}-settings
{{- if or $redisSecret $s3Secret .Values.extraEnv }}
env:
  {{- if $redisSecret }}
  - name: REGISTRY_PROXY_REDIS_URL
    valueFrom:
      secretKeyRef:
        name: {{ .Values.redis.existingSecret }}
        key: {{ .Values.redis.existingSecretKey }}
  {{- end }}
  {{- if $s3Secret }}
  - name: AWS_ACCESS_KEY_ID
    valueFrom:
      secretKeyRef:
        name: {{ $s3Secret }}
        key: {{ .Values.s3.accessKeyIdKey }}
  - name: AWS_SECRET_ACCESS_KEY
    valueFrom:
      secretKeyRef:
        name: {{ $s3Secret }}
        key: {{ .Values.s3.secretAccessKeyKey }}
  {{- end }}
  {{- with .Values.extraEnv }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}
{{- end -}}

{{- define "registry-proxy.settingsMounts" -}}
volumeMounts:
  - name: data
    mountPath: /data
  - name: tmp
    mountPath: /tmp
  {{- if include "registry-proxy.metadataSecretName" . }}
  - name: metadata-secret
    mountPath: /etc/registry-proxy/metadata
    readOnly: true
  {{- end }}
  {{- range include "registry-proxy.files" . | fromJsonArray }}
  - name: {{ .name }}
    mountPath: /etc/registry-proxy/{{ .name }}
    readOnly: true
  {{- end }}
{{- end -}}

{{/* The volumes behind "registry-proxy.settingsMounts"; pass (dict "root" $ "ownData" true) for a data dir of
the pod's own (an emptyDir) instead of the claim. */}}
{{- define "registry-proxy.volumes" -}}
{{- $root := .root -}}
{{- $metadataSecret := include "registry-proxy.metadataSecretName" $root -}}
- name: data
  {{- if and $root.Values.persistence.enabled (not .ownData) }}
  persistentVolumeClaim:
    claimName: {{ default (printf "%s-data" (include "registry-proxy.fullname" $root)) $root.Values.persistence.existingClaim }}
  {{- else }}
  # Owned by the pod's fsGroup; with S3 it holds only downloads in progress and local state.
  emptyDir:
    sizeLimit: {{ $root.Values.persistence.emptyDirSizeLimit }}
  {{- end }}
- name: tmp
  emptyDir:
    sizeLimit: 1Gi
{{- if $metadataSecret }}
- name: metadata-secret
  secret:
    secretName: {{ $metadataSecret }}
    defaultMode: 0440
    items:
      - key: {{ $root.Values.metadataSecret.key }}
        path: {{ $root.Values.metadataSecret.key }}
{{- end }}
{{- range include "registry-proxy.files" $root | fromJsonArray }}
- name: {{ .name }}
  {{- if eq .kind "secret" }}
  secret:
    secretName: {{ .object }}
    defaultMode: 0440
  {{- else }}
  configMap:
    name: {{ .object }}
  {{- end }}
    items:
      - key: {{ .key }}
        path: {{ .key }}
{{- end }}
{{- end -}}

{{/* The `helm test` doctor's pod, as a NetworkPolicyPeer. */}}
{{- define "registry-proxy.doctorPeer" -}}
- podSelector:
    matchLabels:
      {{- include "registry-proxy.selectorLabels" (dict "root" . "component" "doctor") | nindent 6 }}
{{- end -}}
