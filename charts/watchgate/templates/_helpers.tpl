{{/*
watchgate.name is the chart name, or nameOverride.
*/}}
{{- define "watchgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
watchgate.fullname prefixes every resource the chart creates:
fullnameOverride, else the release name when it already contains the chart
name, else "<release>-<chart>". Truncated to 63 characters (DNS label).
*/}}
{{- define "watchgate.fullname" -}}
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

{{/*
watchgate.chart is "<chart>-<version>" for the helm.sh/chart label.
*/}}
{{- define "watchgate.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
watchgate.selectorLabels select the chart's pods. They never change across
upgrades (a Deployment's selector is immutable).
*/}}
{{- define "watchgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "watchgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
watchgate.labels are the standard labels every resource of the chart
carries; the one place they are defined.
*/}}
{{- define "watchgate.labels" -}}
helm.sh/chart: {{ include "watchgate.chart" . }}
{{ include "watchgate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: proxy
app.kubernetes.io/part-of: watchgate
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
watchgate.serviceAccountName is the ServiceAccount the pods run as.
*/}}
{{- define "watchgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "watchgate.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
watchgate.image is "<repository>@<digest>" or "<repository>:<tag>", the tag
defaulting to the chart's appVersion.
*/}}
{{- define "watchgate.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
watchgate.tlsSecretName is the Secret that holds the proxy's serving
certificate: tls.existingSecret, or the one the chart (or cert-manager)
writes.
*/}}
{{- define "watchgate.tlsSecretName" -}}
{{- default (printf "%s-tls" (include "watchgate.fullname" .)) .Values.tls.existingSecret }}
{{- end }}

{{/*
watchgate.tlsSource says where the serving certificate comes from: Secret
(tls.existingSecret), CertManager (certManager.enabled) or Generated (by the
chart). Setting both tls.existingSecret and certManager.enabled is an error.
*/}}
{{- define "watchgate.tlsSource" -}}
{{- if and .Values.tls.existingSecret .Values.certManager.enabled }}
{{- fail "set either tls.existingSecret or certManager.enabled, not both" }}
{{- else if .Values.tls.existingSecret }}Secret
{{- else if .Values.certManager.enabled }}CertManager
{{- else }}Generated
{{- end }}
{{- end }}

{{/*
watchgate.proxyServiceName is the proxy Service's name; clients use
https://<name>.<namespace>.svc:<service.port>.
*/}}
{{- define "watchgate.proxyServiceName" -}}
{{- include "watchgate.fullname" . }}
{{- end }}

{{/*
watchgate.dnsNames are the serving certificate's DNS names: the proxy
Service's in-cluster names plus tls.extraDNSNames, as a YAML list.
*/}}
{{- define "watchgate.dnsNames" -}}
{{- $svc := include "watchgate.proxyServiceName" . -}}
{{- $ns := .Release.Namespace -}}
{{- $names := list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.%s" $svc $ns .Values.clusterDomain) -}}
{{- if .Values.injection.enabled }}
{{- $wh := include "watchgate.webhookServiceName" . -}}
{{- $names = concat $names (list (printf "%s.%s.svc" $wh $ns) (printf "%s.%s.svc.%s" $wh $ns .Values.clusterDomain)) -}}
{{- end }}
{{- concat $names .Values.tls.extraDNSNames | toYaml -}}
{{- end }}

{{/*
watchgate.webhookServiceName is the injection webhook's Service.
*/}}
{{- define "watchgate.webhookServiceName" -}}
{{- printf "%s-webhook" (include "watchgate.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end }}

{{/*
watchgate.generatedTLS generates the chart's CA and serving pair once per
render (or reuses the Secret's) and keeps it in .Values._generatedTLS, so that
the Secret and the webhook's caBundle agree. The Secret carries a digest of
the names the certificate was issued for (annotation
watchgate.io/certificate-names, in .Values._generatedTLSNames): when the
names it must carry change (injection turned on adds the webhook Service's,
tls.extraDNSNames or tls.ipAddresses edited), the pair is issued anew and
.Values._reissuedTLS says so, for NOTES.txt. Returns nothing.
*/}}
{{- define "watchgate.generatedTLS" -}}
{{- if not (hasKey .Values "_generatedTLS") }}
{{- $name := include "watchgate.tlsSecretName" . }}
{{- $dnsNames := include "watchgate.dnsNames" . | fromYamlArray }}
{{- $names := printf "%s|%s" (join "," $dnsNames) (join "," .Values.tls.ipAddresses) | sha256sum | trunc 16 }}
{{- $existing := lookup "v1" "Secret" .Release.Namespace $name }}
{{- $data := dict }}
{{- $complete := and $existing (hasKey $existing "data") (hasKey ($existing.data | default dict) "tls.crt") (hasKey $existing.data "tls.key") }}
{{- if and $complete (eq (dig "metadata" "annotations" "watchgate.io/certificate-names" "" $existing) $names) }}
{{- $data = $existing.data }}
{{- else }}
{{- $days := int .Values.tls.validityDays }}
{{- $ca := genCA (printf "%s-ca" (include "watchgate.fullname" .)) $days }}
{{- $cn := printf "%s.%s.svc" (include "watchgate.proxyServiceName" .) .Release.Namespace }}
{{- $cert := genSignedCert $cn .Values.tls.ipAddresses $dnsNames $days $ca }}
{{- $data = dict "tls.crt" ($cert.Cert | b64enc) "tls.key" ($cert.Key | b64enc) "ca.crt" ($ca.Cert | b64enc) }}
{{- $_ := set .Values "_reissuedTLS" (not (not $complete)) }}
{{- end }}
{{- $_ := set .Values "_generatedTLS" $data }}
{{- $_ := set .Values "_generatedTLSNames" $names }}
{{- end }}
{{- end }}

{{/*
watchgate.injectorSeparate is "true" when the injection webhook and CA
publisher run as a Deployment of their own (injection.separateDeployment).
*/}}
{{- define "watchgate.injectorSeparate" -}}
{{- if and .Values.injection.enabled .Values.injection.separateDeployment }}true{{ end }}
{{- end }}

{{/*
watchgate.injectorName names the separate injector's Deployment,
ServiceAccount and RBAC.
*/}}
{{- define "watchgate.injectorName" -}}
{{- printf "%s-injector" (include "watchgate.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end }}

{{/*
watchgate.injectorSelectorLabels select the separate injector's pods; their
name differs from the proxy's, so that the proxy's Services never select
them.
*/}}
{{- define "watchgate.injectorSelectorLabels" -}}
app.kubernetes.io/name: {{ include "watchgate.name" . }}-injector
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
watchgate.injectorLabels are the separate injector's standard labels.
*/}}
{{- define "watchgate.injectorLabels" -}}
helm.sh/chart: {{ include "watchgate.chart" . }}
{{ include "watchgate.injectorSelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: injector
app.kubernetes.io/part-of: watchgate
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
watchgate.injectorServiceAccountName is the ServiceAccount the injection
webhook and CA publisher run as: the proxy's, or with a separate Deployment
one of their own (when the chart creates ServiceAccounts).
*/}}
{{- define "watchgate.injectorServiceAccountName" -}}
{{- if and (include "watchgate.injectorSeparate" .) .Values.serviceAccount.create }}
{{- include "watchgate.injectorName" . }}
{{- else }}
{{- include "watchgate.serviceAccountName" . }}
{{- end }}
{{- end }}
