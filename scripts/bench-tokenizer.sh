#!/usr/bin/env bash
# The exact Go tokenizer beside Hugging Face's Rust core (npm tokenizers@0.23.2) on the
# same texts, in the same run, both pinned to one core (taskset -c 0, GOMAXPROCS=1). Needs
# scripts/fetch-tokenizers.sh --with-reference. Prints each side's ms per 32 KiB encode and the
# ratio HF/Go (above 1: Go is faster), then the 8k-prompt and next-chat-turn figures.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-tokenizers.sh --with-reference
pin() { if command -v taskset >/dev/null 2>&1; then taskset -c 0 "$@"; else "$@"; fi; }
hf=$(TOKENIZERS_PARALLELISM=false RAYON_NUM_THREADS=1 pin node tokenizer/testdata/bench/bench.mjs)
go=$(GOMAXPROCS=1 pin go test -run '^$' -bench 'Encode/' -benchtime "${BENCHTIME:-30x}" ./tokenizer/)
echo "$hf"
echo "$go" | grep Benchmark
echo
echo "model text tokens hf_ms go_ms hf/go"
echo "$hf" | while read -r _ model text tok ms _; do
  g=$(echo "$go" | awk -v k="BenchmarkEncode/$model/$text" '$1 ~ "^"k {print $3/1e6}')
  awk -v m="$model" -v t="$text" -v tk="${tok#tokens=}" -v h="$ms" -v g="$g" 'BEGIN {printf "%s %s %s %.3f %.3f %.1fx\n", m, t, tk, h, g, h/g}'
done
echo
GOMAXPROCS=1 pin go test -run '^$' -bench 'Prompt8k' -benchtime "${BENCHTIME:-30x}" ./tokenizer/ | grep Benchmark
GOMAXPROCS=1 pin go test -run '^$' -bench 'NextTurn' -benchtime "${BENCHTIME:-30x}" ./tokenizer/chat/ | grep Benchmark
