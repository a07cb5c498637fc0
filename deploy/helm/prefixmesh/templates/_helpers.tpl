{{/* Common names and labels. */}}
{{- define "prefixmesh.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "prefixmesh.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "prefixmesh.labels" -}}
app.kubernetes.io/name: {{ include "prefixmesh.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "prefixmesh.selector" -}}
app.kubernetes.io/name: {{ include "prefixmesh.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "prefixmesh.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "prefixmesh.gossipSecret" -}}
{{- .Values.gossip.existingSecret | default (printf "%s-gossip" (include "prefixmesh.fullname" .)) -}}
{{- end -}}

{{- define "prefixmesh.extProcClientSecret" -}}
{{- .Values.gateway.extProcClientSecret | default (printf "%s-ext-proc-client" (include "prefixmesh.fullname" .)) -}}
{{- end -}}

{{- define "prefixmesh.tlsSecret" -}}
{{- .Values.tls.existingSecret | default (printf "%s-tls" (include "prefixmesh.fullname" .)) -}}
{{- end -}}

{{- define "prefixmesh.serviceAccount" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "prefixmesh.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{/* The headless Service every member joins gossip through (DNS returns every ready pod). */}}
{{- define "prefixmesh.gossipHost" -}}
{{ include "prefixmesh.fullname" . }}-gossip.{{ .Release.Namespace }}.svc.{{ .Values.clusterDomain }}
{{- end -}}

{{- define "prefixmesh.routerPeers" -}}
{{ include "prefixmesh.fullname" . }}-router-peers
{{- end -}}

{{- define "prefixmesh.terminationGrace" -}}
{{ add .Values.drainTimeoutSeconds .Values.terminationGraceExtraSeconds }}
{{- end -}}

{{/* Flags shared by both daemons (one per line, read with --config). */}}
{{- define "prefixmesh.commonFlags" -}}
--log-level={{ .Values.logLevel }}
--drain-timeout={{ .Values.drainTimeoutSeconds }}s
--gossip-listen=:{{ .Values.gossip.port }}
--join={{ include "prefixmesh.gossipHost" . }}
{{- if .Values.gossip.insecure }}
--insecure-gossip
{{- else }}
--gossip-key-file=/etc/prefixmesh/gossip/gossip.key
{{- end }}
{{- if .Values.tls.enabled }}
--tls-server-name={{ include "prefixmesh.tlsServerName" . }}
--tls-cert=/etc/prefixmesh/tls/tls.crt
--tls-key=/etc/prefixmesh/tls/tls.key
--tls-client-ca=/etc/prefixmesh/tls/ca.crt
{{- else }}
--insecure-grpc
{{- end }}
{{- end -}}

{{/* A readiness/startup probe on grpc.health.v1. kubelet's gRPC probes speak no TLS, so with
tls.enabled the probe asks the plaintext HTTP /healthz instead, which reports the same state
(NOT_SERVING until synced, and while draining). Call with (dict "root" $ "grpc" port "http" port). */}}
{{- define "prefixmesh.healthProbe" -}}
{{- if .root.Values.tls.enabled -}}
httpGet:
  path: /healthz
  port: {{ .http }}
{{- else -}}
grpc:
  port: {{ .grpc }}
{{- end -}}
{{- end -}}

{{/* The name every member's certificate carries; peers verify it instead of the pod IP they
dial. */}}
{{- define "prefixmesh.tlsServerName" -}}
{{- .Values.tls.serverName | default (printf "%s.%s.prefixmesh" (include "prefixmesh.fullname" .) .Release.Namespace) -}}
{{- end -}}

{{/* The startup budget of a node agent in seconds: an agent beside a real engine is NOT_SERVING
until the engine answers, which may take node.startupTimeoutSeconds; the simulated engine is the
agent itself. */}}
{{- define "prefixmesh.nodeStartupSeconds" -}}
{{- if eq .Values.node.engine "sim" -}}120{{- else -}}{{ .Values.node.startupTimeoutSeconds }}{{- end -}}
{{- end -}}

{{/* The engine flags that must match the agent's (engine vllm or sglang, engineContainer.injectFlags),
one YAML list item each, derived from the values the agent's flags come from: vLLM's
vllm/engine/arg_utils.py and SGLang's python/sglang/srt/server_args.py name them. */}}
{{- define "prefixmesh.engineFlags" -}}
{{- $n := .Values.node -}}
{{- /* With kvEvents.listen the agent binds the loopback endpoint and the engine connects to it
(vLLM and SGLang connect to an endpoint without "*"); otherwise the engine binds it on every
interface, which a NetworkPolicy must close. The engine always binds its replay endpoint. */ -}}
{{- $endpoint := $n.kvEvents.endpoint -}}
{{- if not $n.kvEvents.listen -}}
{{- $endpoint = printf "tcp://*:%s" (regexFind "[0-9]+$" $n.kvEvents.endpoint) -}}
{{- end -}}
{{- $kv := dict "publisher" "zmq" "endpoint" $endpoint "topic" ($n.kvEvents.topic | default "") -}}
{{- if $n.kvEvents.replay -}}
{{- $_ := set $kv "replay_endpoint" $n.kvEvents.replay -}}
{{- end -}}
{{- $flags := list (printf "--port=%v" $n.engineContainer.port) (printf "--served-model-name=%s" .Values.model) -}}
{{- if eq $n.engine "vllm" -}}
{{- $_ := set $kv "enable_kv_cache_events" true -}}
{{- $flags = concat $flags (list (printf "--block-size=%v" .Values.blockSize) "--enable-prompt-tokens-details") -}}
{{- else -}}
{{- $flags = concat $flags (list (printf "--page-size=%v" .Values.blockSize) "--enable-cache-report") -}}
{{- end -}}
{{- $flags = append $flags (printf "--kv-events-config=%s" (toJson $kv)) -}}
{{- range $flags }}
- {{ . | quote }}
{{- end -}}
{{- end -}}

{{/* The names of the injected engine flags, to refuse the same flag in engineContainer.args. */}}
{{- define "prefixmesh.engineFlagNames" -}}
{{- if eq .Values.node.engine "vllm" -}}
--port --served-model-name --block-size --enable-prompt-tokens-details --kv-events-config
{{- else -}}
--port --served-model-name --page-size --enable-cache-report --kv-events-config
{{- end -}}
{{- end -}}

{{/* Where the router sees its mounted tokenizer files (router.tokenizerFiles). */}}
{{- define "prefixmesh.tokenizerDir" -}}/etc/prefixmesh/tokenizer{{- end -}}

{{/* Pod security: RuntimeDefault seccomp on every pod, as Pod Security "restricted" requires. */}}
{{- define "prefixmesh.seccomp" -}}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* The node agent pools, resolved: node.pools, or one unnamed pool of node.* when it is empty
(the single DaemonSet of earlier releases, its name and selector unchanged). Each pool's role,
KV connector, bootstrap port and placement fall back to node.*; a JSON list, read with
fromJsonArray, so the DaemonSets and the InferencePool resolve pools the same way. */}}
{{- define "prefixmesh.nodePools" -}}
{{- $n := .Values.node -}}
{{- $out := list -}}
{{- $seen := dict -}}
{{- range $p := ($n.pools | default (list (dict "name" ""))) -}}
{{- if hasKey $seen $p.name -}}
{{- fail (printf "node.pools: two pools named %q (each is a DaemonSet named after it)" $p.name) -}}
{{- end -}}
{{- $_ := set $seen $p.name true -}}
{{- $r := dict "name" $p.name "role" ($p.role | default $n.role) "engineArgs" ($p.engineArgs | default list) -}}
{{- range $k := list "kvConnector" "sglangBootstrapPort" "nodeSelector" "tolerations" "affinity" -}}
{{- $_ := set $r $k (ternary (get $p $k) (get $n $k) (hasKey $p $k)) -}}
{{- end -}}
{{- if and (ne $r.kvConnector "sglang") (hasKey $p "sglangBootstrapPort") -}}
{{- fail (printf "node.pools[%s].sglangBootstrapPort: only kvConnector sglang has a bootstrap server" $p.name) -}}
{{- end -}}
{{- $out = append $out $r -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* Whether the InferencePool must leave some node pods out: a pool of prefill-only engines,
which cannot finish a request. Only then does its selector add prefixmesh.io/serves-decode, so
that an install without such a pool keeps its selector across upgrades. */}}
{{- define "prefixmesh.hasPrefillPool" -}}
{{- range fromJsonArray (include "prefixmesh.nodePools" .) -}}
{{- if eq .role "prefill" }}true{{ end -}}
{{- end -}}
{{- end -}}
