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

for values in "" "$chart/ci/prod-values.yaml" "$chart/ci/gateway-values.yaml"; do
	name="${values:-defaults}"
	args=()
	[ -n "$values" ] && args=(-f "$values")
	echo "checkchart: $name"
	"$helm" lint --strict "$chart" "${args[@]}" >/dev/null
	"$helm" template pm "$chart" --namespace llm "${args[@]}" >"$work/rendered.yaml"
	mkdir -p "$work/flags"
	"$work/chartcheck" -manifests "$work/rendered.yaml" -flags-dir "$work/flags" -files-root "$work/root"
	mapfile -t node_args <"$work/flags/node.args"
	mapfile -t router_args <"$work/flags/router.args"
	"$work/prefixmesh-node" "${node_args[@]}" --validate-only
	"$work/prefixmesh-router" "${router_args[@]}" --validate-only
done

# The reference Envoy for the endpoint picker, decoded into Envoy's own protos.
"$work/chartcheck" -envoy deploy/envoy/envoy.yaml

# The schema and the templates' guards must refuse nonsense rather than render it.
for bad in "blockSize=0" "router.policy=fastest" "node.engine=gpu" "router.persistence.enabled=false" \
	"gateway.enabled=true,gateway.httpRoute.create=true" "gateway.inferencePool.failureMode=Maybe"; do
	if "$helm" template pm "$chart" --set "$bad" >/dev/null 2>&1; then
		echo "checkchart: values.schema.json accepted $bad" >&2
		exit 1
	fi
done
echo "checkchart: ok"
