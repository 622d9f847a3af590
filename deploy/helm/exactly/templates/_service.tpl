{{/*
One Exactly service role: its headless Service, StatefulSet and PodDisruptionBudget.

  include "exactly.service" (dict "root" $ "component" "partition-leader"
      "role" "partition_leader" "spec" .Values.partitionLeaders "persistent" true)

The pod name is the node id (--node-id), and the pod's DNS name through the headless
Service is the advertised host, so both survive rescheduling.
*/}}
{{- define "exactly.service" -}}
{{- $root := .root }}
{{- $spec := .spec }}
{{- $name := include "exactly.componentName" (dict "root" $root "component" .component) }}
{{- $labels := include "exactly.componentLabels" (dict "root" $root "component" .component) }}
{{- $selector := include "exactly.componentSelectorLabels" (dict "root" $root "component" .component) }}
{{- $grpcPort := int $root.Values.network.grpcPort }}
{{- $security := $root.Values.security }}
{{- $dataDir := "/var/lib/exactly" }}
{{- if .persistent }}
{{- $dataDir = $spec.persistence.mountPath }}
{{- end }}
apiVersion: v1
kind: Service
metadata:
  name: {{ $name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- $labels | nindent 4 }}
spec:
  type: ClusterIP
  clusterIP: None
  # Pods must resolve their own name before they are ready: they bind and advertise it.
  publishNotReadyAddresses: true
  selector:
    {{- $selector | nindent 4 }}
  ports:
    - name: grpc
      port: {{ $grpcPort }}
      targetPort: grpc
      protocol: TCP
    {{- if ge (int $root.Values.network.kafkaPort) 0 }}
    - name: kafka
      port: {{ $root.Values.network.kafkaPort }}
      targetPort: kafka
      protocol: TCP
    {{- end }}
    {{- if ge (int $root.Values.network.linkPort) 0 }}
    - name: link
      port: {{ $root.Values.network.linkPort }}
      targetPort: link
      protocol: TCP
    {{- end }}
    {{- if $root.Values.metrics.enabled }}
    - name: metrics
      port: {{ $root.Values.metrics.port }}
      targetPort: metrics
      protocol: TCP
    {{- end }}
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: {{ $name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- $labels | nindent 4 }}
spec:
  serviceName: {{ $name }}
  replicas: {{ $spec.replicas }}
  # Pods do not depend on each other's start order; ZooKeeper elects owners.
  podManagementPolicy: Parallel
  updateStrategy:
    type: RollingUpdate
  selector:
    matchLabels:
      {{- $selector | nindent 6 }}
  template:
    metadata:
      labels:
        {{- $labels | nindent 8 }}
        {{- with $spec.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      annotations:
        checksum/config: {{ include (print $root.Template.BasePath "/configmap.yaml") $root | sha256sum }}
        {{- if and $root.Values.metrics.enabled $root.Values.metrics.podAnnotations }}
        prometheus.io/scrape: "true"
        prometheus.io/port: {{ $root.Values.metrics.port | quote }}
        prometheus.io/path: /metrics
        {{- end }}
        {{- with $spec.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    spec:
      serviceAccountName: {{ include "exactly.serviceAccountName" $root }}
      automountServiceAccountToken: false
      enableServiceLinks: false
      terminationGracePeriodSeconds: {{ $spec.terminationGracePeriodSeconds }}
      {{- with $root.Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $spec.priorityClassName }}
      priorityClassName: {{ . }}
      {{- end }}
      securityContext:
        {{- toYaml $root.Values.podSecurityContext | nindent 8 }}
      containers:
        - name: {{ .component }}
          image: {{ include "exactly.image" $root }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          command:
            - /bin/sh
            - /etc/exactly/launch.sh
            - {{ .role }}
            - /etc/exactly/common.properties
            - /etc/exactly/{{ .component }}.properties
            - "--"
          args:
            - --node-id
            - $(POD_NAME)
            {{- if $root.Values.network.bindAllInterfaces }}
            - --host
            - 0.0.0.0
            - --advertised-host
            - $(POD_FQDN)
            {{- else }}
            - --host
            - $(POD_FQDN)
            {{- end }}
            - --port
            - {{ $grpcPort | quote }}
            - --kafka-port
            - {{ $root.Values.network.kafkaPort | quote }}
            - --link-port
            - {{ $root.Values.network.linkPort | quote }}
            - --zookeeper
            - {{ include "exactly.zookeeper.connect" $root }}
            - --data-dir
            - {{ $dataDir }}
            {{- if $root.Values.metrics.enabled }}
            # /metrics on the pod network only (the NetworkPolicy admits the scrapers).
            - --set
            - metrics.bind.address=$(POD_IP)
            {{- end }}
            {{- if $security.enabled }}
            - --set
            - ssl.certificate.location=/etc/exactly-tls/$(POD_NAME).crt
            - --set
            - ssl.key.location=/etc/exactly-tls/$(POD_NAME).key
            {{- end }}
          env:
            - name: POD_NAME
              valueFrom:
                fieldRef:
                  fieldPath: metadata.name
            - name: POD_NAMESPACE
              valueFrom:
                fieldRef:
                  fieldPath: metadata.namespace
            - name: POD_FQDN
              value: $(POD_NAME).{{ $name }}.$(POD_NAMESPACE).svc.{{ $root.Values.clusterDomain }}
            {{- if or $security.enabled $root.Values.metrics.enabled }}
            - name: POD_IP
              valueFrom:
                fieldRef:
                  fieldPath: status.podIP
            {{- end }}
            {{- if $security.enabled }}
            {{- if $security.zookeeper.enabled }}
            - name: EXACTLY_SECRET_SETTINGS_DIR
              value: /etc/exactly-secret-settings
            {{- end }}
            {{- end }}
            {{- if not $root.Values.network.bindAllInterfaces }}
            - name: EXACTLY_WAIT_FOR_HOST
              value: $(POD_FQDN)
            - name: EXACTLY_WAIT_FOR_HOST_SECONDS
              value: {{ $root.Values.network.resolveTimeoutSeconds | quote }}
            {{- end }}
            - name: EXACTLY_LOG_LEVEL
              value: {{ $root.Values.logLevel | quote }}
            - name: HOME
              value: /tmp
            {{- with $spec.extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          ports:
            - name: grpc
              containerPort: {{ $grpcPort }}
              protocol: TCP
            {{- if ge (int $root.Values.network.kafkaPort) 0 }}
            - name: kafka
              containerPort: {{ $root.Values.network.kafkaPort }}
              protocol: TCP
            {{- end }}
            {{- if ge (int $root.Values.network.linkPort) 0 }}
            - name: link
              containerPort: {{ $root.Values.network.linkPort }}
              protocol: TCP
            {{- end }}
            {{- if $root.Values.metrics.enabled }}
            - name: metrics
              containerPort: {{ $root.Values.metrics.port }}
              protocol: TCP
            {{- end }}
          {{- $probes := $root.Values.probes }}
          {{- if $security.enabled }}
          # The kubelet's gRPC probe cannot present a client certificate: files/probe.py
          # calls the same health service over TLS with the pod's certificate.
          startupProbe:
            exec:
              command: ["python", "/etc/exactly/probe.py", {{ $grpcPort | quote }}]
            {{- include "exactly.probeTiming" $probes.startup | nindent 12 }}
          readinessProbe:
            exec:
              command: ["python", "/etc/exactly/probe.py", {{ $grpcPort | quote }}]
            {{- include "exactly.probeTiming" $probes.readiness | nindent 12 }}
          livenessProbe:
            exec:
              # SERVING while the process runs, also while a coordinator loads a partition.
              command: ["python", "/etc/exactly/probe.py", {{ $grpcPort | quote }}, "liveness"]
            {{- include "exactly.probeTiming" $probes.liveness | nindent 12 }}
          {{- else }}
          startupProbe:
            grpc:
              port: {{ $grpcPort }}
            {{- include "exactly.probeTiming" $probes.startup | nindent 12 }}
          readinessProbe:
            grpc:
              port: {{ $grpcPort }}
            {{- include "exactly.probeTiming" $probes.readiness | nindent 12 }}
          livenessProbe:
            grpc:
              port: {{ $grpcPort }}
              # SERVING while the process runs, also while a coordinator loads a partition.
              service: liveness
            {{- include "exactly.probeTiming" $probes.liveness | nindent 12 }}
          {{- end }}
          resources:
            {{- toYaml $spec.resources | nindent 12 }}
          securityContext:
            {{- toYaml $root.Values.securityContext | nindent 12 }}
          volumeMounts:
            - name: config
              mountPath: /etc/exactly
              readOnly: true
            {{- if $security.enabled }}
            # Only this pod's directory of the volume: ca.crt, <pod>.crt, <pod>.key.
            - name: tls
              mountPath: /etc/exactly-tls
              subPathExpr: $(POD_NAME)
              readOnly: true
            {{- if $security.zookeeper.enabled }}
            - name: secret-settings
              mountPath: /etc/exactly-secret-settings
              readOnly: true
            {{- end }}
            {{- end }}
            - name: tmp
              mountPath: /tmp
            - name: data
              mountPath: {{ $dataDir }}
            {{- if and .persistent $spec.persistence.snapshots.enabled }}
            - name: snapshots
              mountPath: {{ $spec.persistence.snapshots.mountPath }}
            {{- end }}
      volumes:
        - name: config
          configMap:
            name: {{ include "exactly.fullname" $root }}-config
        {{- if $security.enabled }}
        - name: tls
          {{- $pods := list }}
          {{- range $i := until (int $spec.replicas) }}
          {{- $pods = append $pods (printf "%s-%d" $name $i) }}
          {{- end }}
          {{- include "exactly.podTlsVolume" (dict "root" $root "pods" $pods) | nindent 10 }}
        {{- if $security.zookeeper.enabled }}
        - name: secret-settings
          secret:
            secretName: {{ include "exactly.security.zookeeperSecret" $root }}
            defaultMode: 288  # 0440
            items:
              - key: {{ $security.zookeeper.passwordKey }}
                path: zookeeper.digest.password
        {{- end }}
        {{- end }}
        - name: tmp
          emptyDir:
            sizeLimit: 256Mi
        {{- if not .persistent }}
        - name: data
          emptyDir:
            sizeLimit: {{ $spec.dataSizeLimit }}
        {{- end }}
      affinity:
        {{- include "exactly.affinity" (dict "affinity" $spec.affinity "labels" $selector) | trim | nindent 8 }}
      {{- with $spec.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $spec.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $spec.topologySpreadConstraints }}
      topologySpreadConstraints:
        {{- toYaml . | nindent 8 }}
      {{- end }}
  {{- if .persistent }}
  volumeClaimTemplates:
    - apiVersion: v1
      kind: PersistentVolumeClaim
      metadata:
        name: data
        labels:
          {{- $selector | nindent 10 }}
      spec:
        accessModes:
          {{- toYaml $spec.persistence.accessModes | nindent 10 }}
        {{- with $spec.persistence.storageClassName }}
        storageClassName: {{ . }}
        {{- end }}
        resources:
          requests:
            storage: {{ $spec.persistence.size }}
    {{- if $spec.persistence.snapshots.enabled }}
    - apiVersion: v1
      kind: PersistentVolumeClaim
      metadata:
        name: snapshots
        labels:
          {{- $selector | nindent 10 }}
      spec:
        accessModes:
          {{- toYaml $spec.persistence.accessModes | nindent 10 }}
        {{- with $spec.persistence.storageClassName }}
        storageClassName: {{ . }}
        {{- end }}
        resources:
          requests:
            storage: {{ $spec.persistence.snapshots.size }}
    {{- end }}
  {{- end }}
{{- if $spec.pdb.enabled }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ $name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- $labels | nindent 4 }}
spec:
  maxUnavailable: {{ $spec.pdb.maxUnavailable }}
  selector:
    matchLabels:
      {{- $selector | nindent 6 }}
{{- end }}
{{- end }}

{{/*
periodSeconds, timeoutSeconds, failureThreshold (and successThreshold) of a probe.
*/}}
{{- define "exactly.probeTiming" -}}
periodSeconds: {{ .periodSeconds }}
timeoutSeconds: {{ .timeoutSeconds }}
failureThreshold: {{ .failureThreshold }}
{{- with .successThreshold }}
successThreshold: {{ . }}
{{- end }}
{{- end }}
