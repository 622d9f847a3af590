{{/*
Chart name, truncated to a DNS label.
*/}}
{{- define "exactly.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: the prefix of every resource name. StatefulSet names get a role suffix, and
the controller-revision-hash label (<statefulset>-<10 chars>) must stay within 63
characters, hence the shorter limit in exactly.componentName.
*/}}
{{- define "exactly.fullname" -}}
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
Name of one component's resources: (dict "root" $ "component" "partition-leader").
*/}}
{{- define "exactly.componentName" -}}
{{- printf "%s-%s" (include "exactly.fullname" .root) .component | trunc 52 | trimSuffix "-" }}
{{- end }}

{{/*
Chart label value.
*/}}
{{- define "exactly.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Standard labels of every resource.
*/}}
{{- define "exactly.labels" -}}
helm.sh/chart: {{ include "exactly.chart" . }}
{{ include "exactly.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: exactly
{{- end }}

{{/*
Selector labels shared by every Exactly service pod (the client Service selects them all:
every service answers Metadata and FindCoordinator).
*/}}
{{- define "exactly.selectorLabels" -}}
app.kubernetes.io/name: {{ include "exactly.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Labels of one component: (dict "root" $ "component" "partition-leader").
*/}}
{{- define "exactly.componentLabels" -}}
{{ include "exactly.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/*
Selector labels of one component: (dict "root" $ "component" "partition-leader").
*/}}
{{- define "exactly.componentSelectorLabels" -}}
{{ include "exactly.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/*
ZooKeeper labels. ZooKeeper pods carry their own app.kubernetes.io/name so that the
client Service of Exactly does not select them.
*/}}
{{- define "exactly.zookeeper.selectorLabels" -}}
app.kubernetes.io/name: {{ include "exactly.name" . }}-zookeeper
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: zookeeper
{{- end }}

{{- define "exactly.zookeeper.labels" -}}
helm.sh/chart: {{ include "exactly.chart" . }}
{{ include "exactly.zookeeper.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.zookeeper.image.tag | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: exactly
{{- end }}

{{- define "exactly.zookeeper.name" -}}
{{- include "exactly.componentName" (dict "root" . "component" "zookeeper") }}
{{- end }}

{{- define "exactly.zookeeper.headlessName" -}}
{{- printf "%s-headless" (include "exactly.zookeeper.name" .) }}
{{- end }}

{{/*
ZooKeeper connect string passed to every service (--zookeeper), with the chroot.
*/}}
{{- define "exactly.zookeeper.connect" -}}
{{- if .Values.zookeeper.external.connect }}
{{- printf "%s%s" .Values.zookeeper.external.connect .Values.zookeeper.chroot }}
{{- else }}
{{- printf "%s.%s.svc.%s:%d%s" (include "exactly.zookeeper.name" .) .Release.Namespace .Values.clusterDomain (int (include "exactly.zookeeper.servicePort" .)) .Values.zookeeper.chroot }}
{{- end }}
{{- end }}

{{/*
Image reference of the Exactly services.
*/}}
{{- define "exactly.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/*
ServiceAccount name.
*/}}
{{- define "exactly.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "exactly.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Bootstrap address of the SDK: the client Service.
*/}}
{{- define "exactly.bootstrapServers" -}}
{{- printf "%s.%s.svc.%s:%d" (include "exactly.fullname" .) .Release.Namespace .Values.clusterDomain (int .Values.network.grpcPort) }}
{{- end }}

{{/*
A properties file from a map of Kafka-style settings, one "key=value" per line, sorted.
Whole-number floats (Helm's reading of unquoted YAML numbers) print as integers.
*/}}
{{- define "exactly.properties" -}}
{{- range $key, $value := . }}
{{- if and (kindIs "float64" $value) (eq $value (float64 (int64 $value))) }}
{{ $key }}={{ int64 $value }}
{{- else }}
{{ $key }}={{ $value }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Default affinity when none is given: prefer one pod of a component per node.
(dict "affinity" <map> "labels" <selector labels string>)
*/}}
{{- define "exactly.affinity" -}}
{{- if .affinity }}
{{- toYaml .affinity }}
{{- else }}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- .labels | nindent 12 }}
{{- end }}
{{- end }}

{{/*
Security helpers (values.yaml, "security").
*/}}
{{- define "exactly.security.tlsSecret" -}}
{{- default (printf "%s-tls" (include "exactly.fullname" .)) .Values.security.tls.existingSecret }}
{{- end }}

{{- define "exactly.security.clientSecret" -}}
{{- default (printf "%s-admin-tls" (include "exactly.fullname" .)) .Values.security.tls.clientSecret }}
{{- end }}

{{/*
What a secured release needs that the chart does not make: without cert-manager, the
certificates (security.tls.existingSecret, security.tls.clientSecret). `helm install` fails
naming them, instead of pods that wait for Secrets nobody creates. (The ZooKeeper passwords
the chart makes itself: templates/secrets.yaml.)
*/}}
{{- define "exactly.security.required" -}}
{{- $security := .Values.security }}
{{- if and $security.enabled (not $security.tls.certManager.enabled) }}
{{- $missing := list }}
{{- if not $security.tls.existingSecret }}
{{- $pods := list }}
{{- range $component, $key := include "exactly.roles" . | fromYaml }}
{{- range $i := until (int (index $.Values $key).replicas) }}
{{- $pods = append $pods (printf "%s-%d" (include "exactly.componentName" (dict "root" $ "component" $component)) $i) }}
{{- end }}
{{- end }}
{{- if and (include "exactly.zookeeper.tls" .) (not .Values.zookeeper.external.connect) }}
{{- $pods = concat $pods (include "exactly.zookeeper.podNames" . | trim | splitList "\n") }}
{{- end }}
{{- $missing = append $missing (printf "--set security.tls.existingSecret=%s-tls: a Secret with ca.crt and, for every pod (%s), <pod name>.crt and <pod name>.key" (include "exactly.fullname" .) (join ", " $pods)) }}
{{- end }}
{{- if not $security.tls.clientSecret }}
{{- $missing = append $missing (printf "--set security.tls.clientSecret=%s-admin-tls: a Secret with ca.crt, tls.crt and tls.key, a client certificate of a super user (User:admin) for helm test and administrators" (include "exactly.fullname" .)) }}
{{- end }}
{{- if $missing }}
{{- fail (printf `security.enabled (the default) needs the cluster's certificates. Either let cert-manager issue them (--set security.tls.certManager.enabled=true, cert-manager's CRDs installed), or create these Secrets in namespace %s and name them (deploy/helm/exactly/README.md, "Certificates: one per pod", shows how with openssl): %s. The ZooKeeper passwords the chart makes itself.` .Release.Namespace (join "; " $missing)) }}
{{- end }}
{{- end }}
{{- end }}

{{- define "exactly.security.zookeeperSecret" -}}
{{- default (printf "%s-zookeeper" (include "exactly.fullname" .)) .Values.security.zookeeper.existingSecret }}
{{- end }}

{{/*
The Exactly roles: component name -> values key (the order of the StatefulSets).
*/}}
{{- define "exactly.roles" -}}
partition-leader: partitionLeaders
txn-coordinator: txnCoordinators
group-coordinator: groupCoordinators
{{- end }}

{{/*
Every Exactly pod name, one per line (the node ids, and the principals User:<pod name>
of the services' certificates).
*/}}
{{- define "exactly.podNames" -}}
{{- $root := . }}
{{- range $component, $key := include "exactly.roles" . | fromYaml }}
{{- $name := include "exactly.componentName" (dict "root" $root "component" $component) }}
{{- range $i := until (int (index $root.Values $key).replicas) }}
{{ $name }}-{{ $i }}
{{- end }}
{{- end }}
{{- end }}

{{/*
super.users: the services' principals, then security.superUsers.
*/}}
{{- define "exactly.security.superUsers" -}}
{{- $users := list }}
{{- range include "exactly.podNames" . | trim | splitList "\n" }}
{{- $users = append $users (printf "User:%s" (trim .)) }}
{{- end }}
{{- range .Values.security.superUsers }}
{{- if not (has . $users) }}
{{- $users = append $users . }}
{{- end }}
{{- end }}
{{- join ";" $users }}
{{- end }}

{{/*
DNS names of the client Service (the bootstrap address clients verify).
*/}}
{{- define "exactly.clientServiceDnsNames" -}}
{{- $svc := include "exactly.fullname" . }}
- {{ $svc }}
- {{ $svc }}.{{ .Release.Namespace }}
- {{ $svc }}.{{ .Release.Namespace }}.svc
- {{ $svc }}.{{ .Release.Namespace }}.svc.{{ .Values.clusterDomain }}
{{- end }}

{{/*
ZooKeeper over TLS (security.zookeeper.tls): the services connect with TLS, and the
chart's own ensemble serves clients on secureClientPort only. "true" or "".
*/}}
{{- define "exactly.zookeeper.tls" -}}
{{- if and .Values.security.enabled .Values.security.zookeeper.tls.enabled }}true{{ end }}
{{- end }}

{{/*
The ZooKeeper port the services connect to: secureClientPort with TLS, else clientPort.
*/}}
{{- define "exactly.zookeeper.servicePort" -}}
{{- if include "exactly.zookeeper.tls" . }}{{ .Values.zookeeper.secureClientPort }}{{ else }}{{ .Values.zookeeper.clientPort }}{{ end }}
{{- end }}

{{/*
Quorum SASL of the chart's own ensemble (security.zookeeper.quorumAuth; an ensemble of
2 or more: a standalone server has no quorum). "true" or "".
*/}}
{{- define "exactly.zookeeper.quorumAuth" -}}
{{- $zk := .Values.zookeeper }}
{{- if and .Values.security.enabled .Values.security.zookeeper.quorumAuth.enabled (not $zk.external.connect) (gt (int $zk.replicas) 1) }}true{{ end }}
{{- end }}

{{- define "exactly.security.zookeeperQuorumSecret" -}}
{{- default (printf "%s-zookeeper-quorum" (include "exactly.fullname" .)) .Values.security.zookeeper.quorumAuth.existingSecret }}
{{- end }}

{{/*
The ZooKeeper pod names, one per line.
*/}}
{{- define "exactly.zookeeper.podNames" -}}
{{- $name := include "exactly.zookeeper.name" . }}
{{- range $i := until (int .Values.zookeeper.replicas) }}
{{ $name }}-{{ $i }}
{{- end }}
{{- end }}

{{/*
DNS names of the ZooKeeper client Service (the host of the services' connect string,
which they check ZooKeeper's certificate against).
*/}}
{{- define "exactly.zookeeper.serviceDnsNames" -}}
{{- $svc := include "exactly.zookeeper.name" . }}
- {{ $svc }}
- {{ $svc }}.{{ .Release.Namespace }}
- {{ $svc }}.{{ .Release.Namespace }}.svc
- {{ $svc }}.{{ .Release.Namespace }}.svc.{{ .Values.clusterDomain }}
{{- end }}

{{/*
The "tls" volume of a StatefulSet's pods: (dict "root" $ "pods" <list of pod names>).
Each pod's files (ca.crt, <pod>.crt, <pod>.key) lie in a directory named after the pod;
the container mounts only its own directory (subPathExpr: $(POD_NAME)), so no container
sees another pod's private key. From the Secrets cert-manager writes (<pod>-tls), or from
security.tls.existingSecret (keys ca.crt, <pod>.crt, <pod>.key).
*/}}
{{- define "exactly.podTlsVolume" -}}
{{- $security := .root.Values.security }}
{{- if $security.tls.certManager.enabled }}
projected:
  defaultMode: 288  # 0440: the user and the fsGroup
  sources:
    {{- range .pods }}
    - secret:
        name: {{ . }}-tls
        items:
          - key: ca.crt
            path: {{ . }}/ca.crt
          - key: tls.crt
            path: {{ . }}/{{ . }}.crt
          - key: tls.key
            path: {{ . }}/{{ . }}.key
    {{- end }}
{{- else }}
secret:
  secretName: {{ include "exactly.security.tlsSecret" .root }}
  defaultMode: 288  # 0440: the user and the fsGroup
  items:
    {{- range .pods }}
    - key: ca.crt
      path: {{ . }}/ca.crt
    - key: {{ . }}.crt
      path: {{ . }}/{{ . }}.crt
    - key: {{ . }}.key
      path: {{ . }}/{{ . }}.key
    {{- end }}
{{- end }}
{{- end }}

{{/*
Label key that lets a pod of the release namespace reach the gRPC and Kafka ports through
the NetworkPolicy (networkPolicy.clients.clientLabel).
*/}}
{{- define "exactly.clientLabel" -}}
{{- printf "%s-client" (include "exactly.fullname" . | trunc 56 | trimSuffix "-") }}
{{- end }}

{{/*
The client port of the ZooKeeper Services: client-tls (secureClientPort) with TLS, else client.
*/}}
{{- define "exactly.zookeeper.clientServicePort" -}}
{{- if include "exactly.zookeeper.tls" . }}
- name: client-tls
  port: {{ .Values.zookeeper.secureClientPort }}
  targetPort: client-tls
{{- else }}
- name: client
  port: {{ .Values.zookeeper.clientPort }}
  targetPort: client
{{- end }}
{{- end }}
