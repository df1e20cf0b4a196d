{{/* Chart name, truncated to the 63 characters of a DNS label. */}}
{{- define "tollgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name: release name, plus the chart name unless the release already holds it. */}}
{{- define "tollgate.fullname" -}}
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

{{- define "tollgate.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tollgate.proxyName" -}}
{{- printf "%s-proxy" (include "tollgate.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tollgate.operatorName" -}}
{{- printf "%s-operator" (include "tollgate.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every resource. */}}
{{- define "tollgate.labels" -}}
helm.sh/chart: {{ include "tollgate.chart" . }}
app.kubernetes.io/name: {{ include "tollgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tollgate
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of one component: include with (dict "ctx" $ "component" "proxy"). */}}
{{- define "tollgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tollgate.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "tollgate.componentLabels" -}}
{{ include "tollgate.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "tollgate.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{- define "tollgate.proxyServiceAccountName" -}}
{{- if .Values.proxy.serviceAccount.create }}
{{- default (include "tollgate.proxyName" .) .Values.proxy.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.proxy.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "tollgate.operatorServiceAccountName" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (include "tollgate.operatorName" .) .Values.operator.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Secret holding DATABASE_URL, REDIS_URL, TOLLGATE_ENCRYPTION_KEY and the extra secrets. */}}
{{- define "tollgate.secretName" -}}
{{- default (include "tollgate.fullname" .) .Values.existingSecret }}
{{- end }}

{{- define "tollgate.configMapName" -}}
{{- printf "%s-config" (include "tollgate.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tollgate.leaseName" -}}
{{- default "tollgate-operator" .Values.config.OPERATOR_LEASE_NAME }}
{{- end }}

{{- define "tollgate.leaseNamespace" -}}
{{- default .Release.Namespace .Values.config.OPERATOR_LEASE_NAMESPACE }}
{{- end }}

{{/*
The encryption key: the value given, else the one already stored in the chart's Secret (so upgrades keep
it), else a new random 64-hex-character key, generated once per render (memoized in .Values) so that the
Secret and the migration hook's Secret agree.
*/}}
{{- define "tollgate.encryptionKey" -}}
{{- if .Values.secrets.encryptionKey }}
{{- .Values.secrets.encryptionKey }}
{{- else }}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "tollgate.fullname" .) }}
{{- if and $existing $existing.data (hasKey $existing.data "TOLLGATE_ENCRYPTION_KEY") }}
{{- index $existing.data "TOLLGATE_ENCRYPTION_KEY" | b64dec }}
{{- else }}
{{- if not (hasKey .Values "__generatedEncryptionKey") }}
{{- $_ := set .Values "__generatedEncryptionKey" (sha256sum (randAlphaNum 64)) }}
{{- end }}
{{- index .Values "__generatedEncryptionKey" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The data of the chart's Secret (and of the migration hook's copy), base64-encoded. */}}
{{- define "tollgate.secretData" -}}
{{- with .Values.secrets.databaseUrl }}
DATABASE_URL: {{ . | b64enc | quote }}
{{- end }}
{{- with .Values.secrets.redisUrl }}
REDIS_URL: {{ . | b64enc | quote }}
{{- end }}
TOLLGATE_ENCRYPTION_KEY: {{ include "tollgate.encryptionKey" . | b64enc | quote }}
{{- with .Values.secrets.encryptionKeys }}
TOLLGATE_ENCRYPTION_KEYS: {{ . | b64enc | quote }}
{{- end }}
{{- with .Values.secrets.adminToken }}
TOLLGATE_ADMIN_TOKEN: {{ . | b64enc | quote }}
{{- end }}
{{- range $key, $value := .Values.secrets.extra }}
{{ $key }}: {{ toString $value | b64enc | quote }}
{{- end }}
{{- end }}

{{/* Non-secret settings: every non-empty `config` entry, plus WEBHOOK_CA_FILE for webhookCaBundle. */}}
{{- define "tollgate.configData" -}}
{{- range $key, $value := .Values.config }}
{{- if not (kindIs "invalid" $value) }}
{{- if ne (toString $value) "" }}
{{ $key }}: {{ toString $value | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- if and .Values.webhookCaBundle (not .Values.config.WEBHOOK_CA_FILE) }}
WEBHOOK_CA_FILE: "/etc/tollgate/webhook-ca/ca.pem"
{{- end }}
{{- end }}

{{/* Environment of every Tollgate container; include with (dict "ctx" $ "port" <PORT or OPERATOR_PORT>). */}}
{{- define "tollgate.env" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "tollgate.secretName" .ctx }}
      key: DATABASE_URL
- name: TOLLGATE_ENCRYPTION_KEY
  valueFrom:
    secretKeyRef:
      name: {{ include "tollgate.secretName" .ctx }}
      key: TOLLGATE_ENCRYPTION_KEY
- name: TOLLGATE_ENCRYPTION_KEYS
  valueFrom:
    secretKeyRef:
      name: {{ include "tollgate.secretName" .ctx }}
      key: TOLLGATE_ENCRYPTION_KEYS
      optional: true
- name: REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "tollgate.secretName" .ctx }}
      key: REDIS_URL
      optional: true
- name: TOLLGATE_ADMIN_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "tollgate.secretName" .ctx }}
      key: TOLLGATE_ADMIN_TOKEN
      optional: true
{{- with .ctx.Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Volumes of every Tollgate pod: a writable /tmp on the read-only root filesystem, the CA bundle. */}}
{{- define "tollgate.volumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: 256Mi
{{- if .Values.webhookCaBundle }}
- name: webhook-ca
  configMap:
    name: {{ include "tollgate.configMapName" . }}
    items:
      - key: webhook-ca.pem
        path: ca.pem
{{- end }}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "tollgate.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if .Values.webhookCaBundle }}
- name: webhook-ca
  mountPath: /etc/tollgate/webhook-ca
  readOnly: true
{{- end }}
{{- with .Values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Pod annotations that roll the pods when the configuration or the secrets change. */}}
{{- define "tollgate.checksums" -}}
checksum/config: {{ include "tollgate.configData" . | sha256sum }}
{{- if not .Values.existingSecret }}
checksum/secret: {{ include "tollgate.secretData" . | sha256sum }}
{{- end }}
{{- end }}

{{/* The operator's rules where it watches WebhookSubscriptions (a Role per namespace, or a ClusterRole). */}}
{{- define "tollgate.operatorWatchRules" -}}
# The informers, and the finalizers (a merge patch): WebhookSubscriptions and the deployment's resources.
- apiGroups: ["tollgate.dev"]
  resources: ["webhooksubscriptions", "projects", "apikeys", "modelproviders", "pricelists", "limitpolicies"]
  verbs: ["list", "watch", "patch"]
- apiGroups: ["tollgate.dev"]
  resources: ["webhooksubscriptions/status", "projects/status", "apikeys/status", "modelproviders/status", "pricelists/status", "limitpolicies/status"]
  verbs: ["patch"]
# Owner references with blockOwnerDeletion on the Secrets it generates (signing secrets, API keys).
- apiGroups: ["tollgate.dev"]
  resources: ["webhooksubscriptions/finalizers", "apikeys/finalizers"]
  verbs: ["update"]
# Secrets it reads (signing secrets, provider keys) or writes (generated signing secrets, API keys: update
# when a key is re-issued), only in the watched namespaces.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "list", "watch", "create", "update"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}

{{/*
Refuses an install against a real cluster that has no database: without DATABASE_URL every pod would stay
in CreateContainerConfigError and the migration hook would time out. Offline rendering (helm template,
helm lint) cannot see a cluster, so it renders and NOTES.txt tells what is missing.
*/}}
{{- define "tollgate.validate" -}}
{{- if and (not .Values.existingSecret) (not .Values.secrets.databaseUrl) }}
{{- if lookup "v1" "ConfigMap" .Release.Namespace "kube-root-ca.crt" }}
{{- fail "Tollgate needs Postgres: set secrets.databaseUrl (postgres://user:password@host:5432/db) or existingSecret (a Secret with DATABASE_URL and TOLLGATE_ENCRYPTION_KEY)." }}
{{- end }}
{{- end }}
{{- with .Values.secrets.encryptionKey }}
{{- if not (regexMatch "^[0-9a-fA-F]{64}$" .) }}
{{- if not (regexMatch "^[A-Za-z0-9+/_-]{43}={0,1}$" .) }}
{{- fail "secrets.encryptionKey must be 32 bytes: 64 hex characters (openssl rand -hex 32) or base64." }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
