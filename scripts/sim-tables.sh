#!/usr/bin/env bash
# Regenerates the simulator figures that README.md and routing/POLICIES.md quote: every trace in
# data/traces as recorded (every policy) and with arrivals rounded to 1 s and 3 s (the policies
# that compete: prefixmesh, least-loaded, sglang-gate, dynamo-cost), one router and eight
# sharing, at 8 nodes; every trace at 64 nodes (eight times the 8-node speed) the same way; the
# Mooncake trace with every fourth node at half speed (the routers are not told); and, to show
# how much one run of the Azure traces moves with the synthetic prefixes laid over them,
# prefixmesh on each as recorded with four other seeds. One JSON file and one table per run in
# ${OUT:-docs/sim}, named trace_quantum[_variant]; a run whose JSON exists is skipped, so an
# interrupted regeneration resumes. Takes about half an hour on two cores.
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
  if [ -s "$out/$name.json" ]; then
    return
  fi
  echo "== $name: router sim $*" >&2
  "$bin" sim --routers 1,8 --json "$out/$name.json" "$@" "${EXTRA[@]}" >"$out/$name.txt"
}
EXTRA=("$@")
few=prefixmesh,least-loaded,sglang-gate,dynamo-cost
code=(--trace data/traces/AzureLLMInferenceTrace_code.csv --speed 8)
conv=(--trace data/traces/AzureLLMInferenceTrace_conv.csv --speed 10)
run mooncake_q0 --policies "$all"
run azure-code_q0 --policies "$all" "${code[@]}"
run azure-conv_q0 --policies "$all" "${conv[@]}"
run mooncake_q0_half-speed --policies "$few" --node-speeds 1,1,1,0.5
for q in 1s 3s; do
  run "mooncake_q$q" --policies "$few" --arrival-quantum "$q"
  run "azure-code_q$q" --policies "$few" --arrival-quantum "$q" "${code[@]}"
  run "azure-conv_q$q" --policies "$few" --arrival-quantum "$q" "${conv[@]}"
done
for q in 0 1s 3s; do
  run "fleet64_q$q" --policies prefixmesh,sglang-gate,dynamo-cost --nodes 64 --speed 8 --arrival-quantum "$q"
  run "fleet64-code_q$q" --policies prefixmesh,sglang-gate,dynamo-cost --nodes 64 --arrival-quantum "$q" \
    --trace data/traces/AzureLLMInferenceTrace_code.csv --speed 64
  run "fleet64-conv_q$q" --policies prefixmesh,sglang-gate,dynamo-cost --nodes 64 --arrival-quantum "$q" \
    --trace data/traces/AzureLLMInferenceTrace_conv.csv --speed 80
done
for seed in 1 2 3 4; do
  run "azure-code_q0_seed$seed" --policies prefixmesh "${code[@]}" --seed "$seed"
  run "azure-conv_q0_seed$seed" --policies prefixmesh "${conv[@]}" --seed "$seed"
done
