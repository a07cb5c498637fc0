#!/usr/bin/env bash
# checkchart.sh renders the Helm chart for its default values and for a production-like values
# file, lints it, decodes every manifest strictly into Kubernetes API types (deploy/helm/chartcheck),
# checks that the schema rejects bad values, and runs both binaries with --validate-only on the
# exact flags the chart passes them. helm is built from source at a pinned version into
# .cache/bin (the machine reaches only the Go module proxy) and reused while the version matches.
set -euo pipefail

HELM_VERSION=v3.21.4

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
bin="$repo/.cache/bin"
mkdir -p "$bin"
if [ ! -x "$bin/helm" ] || [ "$(cat "$bin/.helm.version" 2>/dev/null)" != "$HELM_VERSION" ]; then
	echo "checkchart: building helm $HELM_VERSION (once; cached in .cache/bin)" >&2
	GOBIN="$bin" GOFLAGS=-mod=mod go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
	echo "$HELM_VERSION" >"$bin/.helm.version"
fi
helm="$bin/helm"
chart=deploy/helm/prefixmesh
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

(cd deploy/helm/chartcheck && go build -o "$work/chartcheck" .)
go build -o "$work/prefixmesh-node" ./cmd/node
go build -o "$work/prefixmesh-router" ./cmd/router

# render VALUES_ARGS… renders the chart into $work/rendered.yaml.
render() { "$helm" template pm "$chart" --namespace llm "$@" >"$work/rendered.yaml"; }
# check [chartcheck flags…] decodes and checks $work/rendered.yaml, writing the daemons' flags.
check() {
	rm -rf "$work/flags" "$work/root" && mkdir -p "$work/flags"
	"$work/chartcheck" -manifests "$work/rendered.yaml" -flags-dir "$work/flags" -files-root "$work/root" "$@"
}

# Every values file in ci/ is an example CI keeps true: the production-like one, one per
# tokenizer spec (hf: from an image, render:, engine) and prefill/decode pools. Every node pool
# (DaemonSet) has its own flags (node-<DaemonSet>.args): each must pass --validate-only.
for values in "" "$chart"/ci/*.yaml; do
	name="${values:-defaults}"
	args=()
	[ -n "$values" ] && args=(-f "$values")
	echo "checkchart: $name"
	"$helm" lint --strict "$chart" "${args[@]}" >/dev/null
	render "${args[@]}"
	check -cluster-domain cluster.local
	for pool in "$work"/flags/node-*.args; do
		mapfile -t node_args <"$pool"
		"$work/prefixmesh-node" "${node_args[@]}" --validate-only
	done
	mapfile -t router_args <"$work/flags/router.args"
	"$work/prefixmesh-router" "${router_args[@]}" --validate-only
done
# The prefill/decode example renders a DaemonSet per pool, and its InferencePool leaves the
# prefill pods out.
render -f "$chart/ci/pd-values.yaml"
check -cluster-domain cluster.local >/dev/null
for ds in prefill decode; do
	[ -f "$work/flags/node-pm-prefixmesh-node-$ds.args" ] || { echo "checkchart: no $ds pool DaemonSet" >&2; exit 1; }
done
grep -qx -- '--role=prefill' "$work/flags/node-pm-prefixmesh-node-prefill.args" &&
	grep -qx -- '--role=decode' "$work/flags/node-pm-prefixmesh-node-decode.args" ||
	{ echo "checkchart: a pool's agents do not run its role" >&2; exit 1; }

# The reference Envoys for the endpoint picker, decoded into Envoy's own protos.
for envoy in deploy/envoy/*.yaml; do "$work/chartcheck" -envoy "$envoy"; done

# Another cluster domain reaches every address that names one.
render --set clusterDomain=corp.internal
check -cluster-domain corp.internal >/dev/null
if check -cluster-domain cluster.local >/dev/null 2>&1; then
	echo "checkchart: clusterDomain=corp.internal still rendered svc.cluster.local somewhere" >&2
	exit 1
fi

# The schema and the templates' guards must refuse nonsense rather than render it.
vllm=(--set node.engine=vllm --set node.engineContainer.image=vllm/vllm-openai:v0.11.0)
for bad in "blockSize=0" "router.policy=fastest" "node.engine=gpu" "router.persistence.enabled=false" \
	"router.replicas=2" "router.replicas=4" "node.engine=vllm" "router.tokenizer=hf:/etc/prefixmesh/tokenizer" \
	"router.tokenizerFiles.image=models:1" "router.tokenizerFiles.persistentVolumeClaim=models" \
	"node.engineContainer.args={--block-size=16}" \
	"gateway.enabled=true,gateway.httpRoute.create=true" "gateway.inferencePool.failureMode=Maybe" "gateway.extProcTLS=maybe" \
	"gateway.enabled=true,tls.enabled=false" "networkPolicy.enabled=maybe" \
	"dashboards.label=-bad" "dashboards.labelValue=not one" "alerts.enabled=yes" \
	"node.role=leader" "node.kvConnector=mooncake" "node.pools[0].name=a,node.pools[0].role=encode" "node.pools[0].name=Prefill" \
	"node.pools[0].name=a,node.pools[1].name=a" "node.pools[0].name=a,node.pools[0].sglangBootstrapPort=9000"; do
	if "$helm" template pm "$chart" "${vllm[@]}" --set router.tokenizer=engine --set "$bad" >/dev/null 2>&1 &&
		"$helm" template pm "$chart" --set "$bad" >/dev/null 2>&1; then
		echo "checkchart: the chart accepted $bad" >&2
		exit 1
	fi
done

# chartcheck's rules must reject what they guard against: each of these renders, and fails.
reject() {
	local why="$1"
	shift
	render "$@"
	if check -cluster-domain cluster.local >/dev/null 2>&1; then
		echo "checkchart: chartcheck accepted $why" >&2
		exit 1
	fi
}
reject "agents of real engines on every node" --set node.nodeSelector=null
# A simulated staging fleet may run everywhere (the chart README's first install).
render --set node.engine=sim --set node.nodeSelector=null
check -cluster-domain cluster.local >/dev/null
reject "a short agent startup beside vLLM" "${vllm[@]}" --set router.tokenizer=engine --set node.startupTimeoutSeconds=120
reject "an engine sidecar without probes" "${vllm[@]}" --set router.tokenizer=engine --set node.engineContainer.healthPath=
reject "vLLM flags not matched to the agent's" "${vllm[@]}" --set router.tokenizer=engine --set node.engineContainer.injectFlags=false
reject "vLLM flags that disagree with the agent's" "${vllm[@]}" --set router.tokenizer=engine --set node.engineContainer.injectFlags=false \
	--set-json 'node.engineContainer.args=["--port=8000","--served-model-name=prefixmesh-sim","--block-size=32","--enable-prompt-tokens-details","--kv-events-config={\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:5557\",\"replay_endpoint\":\"tcp://*:5558\",\"topic\":\"\"}"]'
reject "an InferencePool over prefill-only engines" -f "$chart/ci/pd-values.yaml" \
	--set-json 'gateway.inferencePool.selector={"app.kubernetes.io/component":"node"}'
render -f "$chart/ci/pd-values.yaml"
sed 's/^            - --role=prefill$/            - --role=decode/' "$work/rendered.yaml" >"$work/relabel.yaml" && mv "$work/relabel.yaml" "$work/rendered.yaml"
if check -cluster-domain cluster.local >/dev/null 2>&1; then
	echo "checkchart: chartcheck accepted pods whose role label is not their agent's --role" >&2
	exit 1
fi
reject "router voters free to share a host" --set-json 'router.affinity={"podAffinity":{}}'
# A NetworkPolicy that no longer admits a port the pods open (here Raft's) must be caught.
render
sed 's/^        - port: 7000$/        - port: 7001/' "$work/rendered.yaml" >"$work/closed.yaml" && mv "$work/closed.yaml" "$work/rendered.yaml"
if check >/dev/null 2>&1; then
	echo "checkchart: chartcheck accepted a NetworkPolicy set that closes Raft" >&2
	exit 1
fi
# Without TLS the chart passes the explicit plaintext flags, which the daemons accept.
render --set tls.enabled=false
check -cluster-domain cluster.local >/dev/null
grep -qx -- '--insecure-grpc' "$work/flags/node.args" && grep -qx -- '--insecure-raft' "$work/flags/router.args" ||
	{ echo "checkchart: tls.enabled=false without --insecure-grpc/--insecure-raft" >&2; exit 1; }
mapfile -t node_args <"$work/flags/node.args"
mapfile -t router_args <"$work/flags/router.args"
"$work/prefixmesh-node" "${node_args[@]}" --validate-only >/dev/null
"$work/prefixmesh-router" "${router_args[@]}" --validate-only >/dev/null
render
sed 's/^  replicas: 3$/  replicas: 2/' "$work/rendered.yaml" >"$work/even.yaml" && mv "$work/even.yaml" "$work/rendered.yaml"
if check >/dev/null 2>&1; then
	echo "checkchart: chartcheck accepted an even number of Raft voters" >&2
	exit 1
fi
render
sed '/seccompProfile:/,+1d' "$work/rendered.yaml" >"$work/noseccomp.yaml" && mv "$work/noseccomp.yaml" "$work/rendered.yaml"
if check >/dev/null 2>&1; then
	echo "checkchart: chartcheck accepted pods without a seccomp profile" >&2
	exit 1
fi
# The same flags, injected, pass.
render "${vllm[@]}" --set router.tokenizer=engine
check -cluster-domain cluster.local >/dev/null

# NOTES.txt warns when the agents point at no engine (the defaults), and only then. helm
# template skips NOTES.txt (and wants YAML from templates), so render a copy of the chart where
# a template holds NOTES.txt, rendered with tpl, as a YAML string.
cp -r "$chart" "$work/notes-chart"
mv "$work/notes-chart/templates/NOTES.txt" "$work/notes-chart/NOTES.txt"
printf '%s\n' 'notes: |' '{{ tpl (.Files.Get "NOTES.txt") . | indent 2 }}' >"$work/notes-chart/templates/notes.yaml"
notes() { "$helm" template pm "$work/notes-chart" --namespace llm --show-only templates/notes.yaml "$@"; }
warning="WARNING: the node agents point at no engine"
notes | grep -q "$warning" || { echo "checkchart: no warning for agents pointing at nothing" >&2; exit 1; }
for ok in "node.engine=sim" "node.mode=hostNetwork" "node.engineContainer.image=engine:1" "node.engineURL=http://e:8000"; do
	if notes --set "$ok" | grep -q "$warning"; then
		echo "checkchart: warned about agents pointing at nothing with $ok" >&2
		exit 1
	fi
done
echo "checkchart: ok"
