#!/usr/bin/env bash
# Regenerates the simulator figures that README.md and routing/POLICIES.md quote: every trace in
# data/traces as recorded and with arrivals rounded to 1 s and 3 s, every policy, one router and
# eight sharing, at 8 nodes; the Mooncake trace at 64 nodes (8× speed); and the Mooncake trace
# with every fourth node at half speed (the routers are not told). One JSON file per run in
# ${OUT:-docs/sim}, named trace_quantum[_variant].json. Takes about an hour on two cores.
# Usage: scripts/sim-tables.sh [extra router sim flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-docs/sim}"
mkdir -p "$out"
bin="$(mktemp -d)/router"
go build -o "$bin" ./cmd/router
all=prefixmesh,round-robin,least-loaded,chwbl,longest-prefix,sglang-gate,dynamo-cost
run() { # name, then flags
  local name=$1
  shift
  echo "== $name: router sim $*" >&2
  "$bin" sim --routers 1,8 --json "$out/$name.json" "$@" "${EXTRA[@]}" >"$out/$name.txt"
}
EXTRA=("$@")
for q in 0 1s 3s; do
  run "mooncake_q$q" --policies "$all" --arrival-quantum "$q"
  run "azure-code_q$q" --policies "$all" --arrival-quantum "$q" --trace data/traces/AzureLLMInferenceTrace_code.csv --speed 8
  run "azure-conv_q$q" --policies "$all" --arrival-quantum "$q" --trace data/traces/AzureLLMInferenceTrace_conv.csv --speed 10
done
run mooncake_q0_half-speed --policies "$all" --node-speeds 1,1,1,0.5
for q in 0 1s 3s; do
  run "fleet64_q$q" --policies prefixmesh,least-loaded,sglang-gate,dynamo-cost --nodes 64 --speed 8 --arrival-quantum "$q"
done
