#!/usr/bin/env bash
# The whole front-door decision's instructions for an 8k-token prompt over 64 nodes against
# hashing the same prompt (BenchmarkPickDecision in ./router/frontdoor), counted by valgrind's
# callgrind: repeatable for the same binary whatever else the machine is doing, where the
# benchmark's wall time on a shared machine moves by half between runs. For each sub-benchmark,
# the whole process's count at two run lengths; their difference over the extra iterations is
# one iteration's cost. Usage: scripts/bench-decision-instructions.sh [TESTBIN] (default:
# builds ./router/frontdoor's test binary). Needs Debian's valgrind; Go's signal-based
# preemption is turned off (GODEBUG=asyncpreemptoff=1), which callgrind cannot follow.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-}"
if [ -z "$bin" ]; then
  bin="$(mktemp -d)/frontdoor.test"
  go test -c -o "$bin" ./router/frontdoor/
fi
short=200 long=1000
count() { # sub-benchmark n → instructions of the whole run
  local out
  out="$(mktemp -d)"
  (cd router/frontdoor && GODEBUG=asyncpreemptoff=1 GOMAXPROCS=1 valgrind --tool=callgrind --callgrind-out-file="$out/cg" \
    "$bin" -test.run '^$' -test.bench "PickDecision/8k/$1\$" -test.benchtime "${2}x" >/dev/null 2>"$out/log")
  grep -m1 -o 'Collected : [0-9]*' "$out/log" | grep -o '[0-9]*'
  rm -rf "$out"
}
declare -A per
for sub in hash-only empty-overlay overlay; do
  a=$(count "$sub" "$short")
  b=$(count "$sub" "$long")
  per[$sub]=$(( (b - a) / (long - short) ))
  echo "$sub: $(( per[$sub] / 1000 ))k instructions per iteration (runs of $short and $long: $a, $b)"
done
for sub in empty-overlay overlay; do
  echo "$sub decision / hashing: $(awk -v a="${per[$sub]}" -v b="${per[hash-only]}" 'BEGIN{printf "%.2f", a/b}')×"
done
