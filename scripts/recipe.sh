#!/usr/bin/env bash
# recipe.sh is README.md's "Running it for real": three nodes and a router as separate processes
# on loopback, the way production runs. Each node is an engine (the simulated engine, a faithful
# vLLM publishing its cache changes as vLLM KV events over ZMQ) plus a node agent beside it in
# --engine vllm mode, mirroring the engine's cache from those events as it would beside vLLM.
#
# Everything it makes lives in one scratch directory outside the checkout (binaries, the gossip
# key, Raft data, one log file per daemon), printed first. Each step waits for what the next one
# needs and says what it waited for; a wait that times out names the log to read. Then it sends
# the README's requests and checks their answers, and keeps the cluster up until Ctrl-C (with
# --exit, it stops once the checks pass: the test in cmd/router runs it that way).
#
# Environment: RECIPE_DIR (the scratch directory; default a new mktemp -d), RECIPE_PORT_OFFSET
# (added to every port below; default 0), RECIPE_WAIT (seconds each wait may take; default 60).
set -euo pipefail

exit_after_checks=false
case "${1:-}" in
--exit) exit_after_checks=true ;;
"") ;;
*)
	echo "usage: scripts/recipe.sh [--exit]" >&2
	exit 2
	;;
esac

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="${RECIPE_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/prefixmesh-recipe.XXXXXX")}"
off="${RECIPE_PORT_OFFSET:-0}"
wait_s="${RECIPE_WAIT:-60}"
p() { echo $(($1 + off)); } # a documented port, moved by the offset
mkdir -p "$dir/bin" "$dir/logs"
echo "recipe: scratch directory $dir (binaries, gossip.key, Raft data, logs/)"

# Build the two binaries; grpcurl from the Go module proxy unless it is on PATH already.
(cd "$repo" && go build -o "$dir/bin/prefixmesh-node" ./cmd/node && go build -o "$dir/bin/prefixmesh-router" ./cmd/router)
export PATH="$dir/bin:$PATH"
if ! command -v grpcurl >/dev/null; then
	echo "recipe: installing grpcurl v1.9.3 into $dir/bin"
	GOBIN="$dir/bin" go install github.com/fullstorydev/grpcurl/cmd/grpcurl@v1.9.3
fi
head -c 32 /dev/urandom | base64 >"$dir/gossip.key"
chmod 600 "$dir/gossip.key"

# Every daemon runs in the background with its output in logs/NAME.log, and stops with the script.
pids=()
start() {
	local name="$1"
	shift
	"$@" >"$dir/logs/$name.log" 2>&1 &
	pids+=($!)
}
stop() {
	trap - EXIT INT TERM
	if [ ${#pids[@]} -gt 0 ]; then
		kill "${pids[@]}" 2>/dev/null || true
		wait "${pids[@]}" 2>/dev/null || true
	fi
}
trap stop EXIT
trap 'exit 130' INT TERM

# waitfor WHAT LOG CMD…: retry CMD until it succeeds, at most RECIPE_WAIT seconds.
waitfor() {
	local what="$1" log="$2"
	shift 2
	local deadline=$((SECONDS + wait_s))
	until "$@" >/dev/null 2>&1; do
		if [ $SECONDS -ge $deadline ]; then
			echo "recipe: gave up after ${wait_s}s waiting for $what; see $dir/logs/$log" >&2
			exit 1
		fi
		sleep 0.2
	done
	echo "recipe: ok: $what"
}
healthy() { curl -sf -o /dev/null "http://127.0.0.1:$1$2"; }
metric() { # metric PORT NAME VALUE: the Prometheus sample NAME on PORT equals VALUE
	curl -sf "http://127.0.0.1:$1/metrics" | grep -x "$2 $3" >/dev/null # not -q: curl must not meet a closed pipe
}

router_grpc=127.0.0.1:$(p 7080)
router_http=$(p 8081)
start router prefixmesh-router --node-id router-0 --grpc-listen "$router_grpc" --http-listen 127.0.0.1:"$router_http" \
	--gossip-listen 127.0.0.1:"$(p 7946)" --gossip-key-file "$dir/gossip.key" --raft-listen 127.0.0.1:"$(p 7000)" --raft-dir "$dir/raft"
waitfor "router serving (its /healthz)" router.log healthy "$router_http" /healthz

for i in 1 2 3; do
	n=$(echo a b c | cut -d' ' -f$i)
	# The engine: OpenAI API on :900i, KV events on :555i, replay on :556i.
	start "engine-$n" prefixmesh-node --node-id "engine-$n" --grpc-listen 127.0.0.1:"$(p 717$i)" --http-listen 127.0.0.1:"$(p 900$i)" \
		--sim-kv-events tcp://127.0.0.1:"$(p 555$i)" --sim-kv-events-replay tcp://127.0.0.1:"$(p 556$i)"
	# The node agent beside it: mirrors the engine, gossips its summary to the router.
	start "node-$n" prefixmesh-node --node-id "node-$n" --engine vllm --engine-url http://127.0.0.1:"$(p 900$i)" \
		--kv-events tcp://127.0.0.1:"$(p 555$i)" --kv-events-replay tcp://127.0.0.1:"$(p 556$i)" \
		--grpc-listen 127.0.0.1:"$(p 707$i)" --http-listen 127.0.0.1:"$(p 809$i)" \
		--gossip-listen 127.0.0.1:"$(p 795$i)" --join 127.0.0.1:"$(p 7946)" --gossip-key-file "$dir/gossip.key"
done
for i in 1 2 3; do
	n=$(echo a b c | cut -d' ' -f$i)
	waitfor "engine-$n answering (its /health)" "engine-$n.log" healthy "$(p 900$i)" /health
	waitfor "node-$n serving: its engine up, its mirror synced, gossip joined (its /healthz)" "node-$n.log" healthy "$(p 809$i)" /healthz
done
waitfor "the router mirroring all 3 nodes" router.log metric "$router_http" prefixmesh_gossip_mirrored_nodes 3
waitfor "every node's summary at the router (no cold node)" router.log metric "$router_http" prefixmesh_gossip_cold_nodes 0
grpcurl -plaintext "$router_grpc" grpc.health.v1.Health/Check | grep SERVING >/dev/null
echo "recipe: ok: router grpc.health.v1 SERVING"

# A 40-token prompt: the first time no node holds it.
tok=$(seq -s, 1 40)
body="{\"model\":\"prefixmesh-sim\",\"prompt\":[$tok],\"max_tokens\":4}"
complete() {
	curl -sf -o /dev/null -D - "http://127.0.0.1:$router_http/v1/completions" -H 'Content-Type: application/json' -d "$body" |
		tr -d '\r' | grep -i '^x-prefixmesh-'
}
first=$(complete)
echo "$first" | sed 's/^/recipe: first request: /'
node=$(echo "$first" | sed -n 's/^[Xx]-[Pp]refixmesh-[Nn]ode: //p')
echo "$first" | grep -qix 'x-prefixmesh-estimated-tokens: 0' || {
	echo "recipe: the first request was estimated as cached" >&2
	exit 1
}
# The engine's KV events reach the agent's mirror, its summary reaches the router by gossip:
# Route then estimates two full 16-token blocks on the node that served it.
route() { grpcurl -plaintext -d "{\"tokens\":[$tok]}" "$router_grpc" prefixmesh.v1.Router/Route; }
learnt() {
	local r
	r=$(route) && grep -q '"estimatedMatchedTokens": "32"' <<<"$r" && grep -q "\"nodeId\": \"$node\"" <<<"$r"
}
waitfor "Route estimating 32 tokens (two 16-token blocks) on the node that served it" router.log learnt
r=$(route)
grep -E '^  "(nodeId|estimatedMatchedTokens)"' <<<"$r" | sed 's/^ */recipe: route: /'
second=$(complete)
echo "$second" | sed 's/^/recipe: the same request again: /'
for h in "x-prefixmesh-node: $node" 'x-prefixmesh-estimated-tokens: 32' 'x-prefixmesh-cached-tokens: 32'; do
	echo "$second" | grep -qix "$h" || {
		echo "recipe: the second request lacks \"$h\"" >&2
		exit 1
	}
done
# The mirror, seen on node-a's agent.
m=$(curl -sf "http://127.0.0.1:$(p 8091)/metrics")
grep -E '^prefixmesh_kvevents_(batches_total|block_copies\{tier="gpu"\})' <<<"$m" | sed 's/^/recipe: node-a: /'

echo "recipe: ready: router gRPC $router_grpc, HTTP 127.0.0.1:$router_http; logs in $dir/logs"
echo "recipe: the binaries and grpcurl: export PATH=$dir/bin:\$PATH"
if $exit_after_checks; then
	exit 0
fi
echo "recipe: the cluster stays up until Ctrl-C (then: rm -rf $dir)"
wait "${pids[0]}"
