#!/usr/bin/env bash
# The endpoint picker's instructions per request for an 8k-token id prompt, counted by valgrind's
# callgrind (repeatable for the same binary and inputs, whatever else the machine is doing): for
# each of BenchmarkDecision's ways in router/extproc (picker alone, the request service in
# process, through ext_proc with the Go gateway in the same process), the whole process's count at
# two run lengths; their difference over the extra requests is one request's cost. The collector is off
# (GOGC=off): with it on, a collection of the setup's garbage (the tokenizer's tables) landing in
# one run and not the other moves a count by ±20%; what a request leaves to the collector is its
# allocation (-benchmem). Go's signal-based preemption is off too (GODEBUG=asyncpreemptoff=1):
# callgrind cannot follow it. Usage: scripts/bench-extproc-instructions.sh [TESTBIN] (default:
# builds ./router/extproc's test binary). Needs Debian's valgrind.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-}"
if [ -z "$bin" ]; then
  bin="$(mktemp -d)/extproc.test"
  go test -c -o "$bin" ./router/extproc/
fi
short=50 long=250
count() { # way n → instructions of the whole run
  local out
  out="$(mktemp -d)"
  (cd router/extproc && GOGC=off GODEBUG=asyncpreemptoff=1 GOMAXPROCS=1 valgrind --tool=callgrind --callgrind-out-file="$out/cg" \
    "$bin" -test.run '^$' -test.bench "BenchmarkDecision/ids/$1\$" -test.benchtime "${2}x" >/dev/null 2>"$out/log")
  grep -m1 -o 'Collected : [0-9]*' "$out/log" | grep -o '[0-9]*'
  rm -rf "$out"
}
declare -A per
for way in picker service extproc; do
  a=$(count "$way" "$short")
  b=$(count "$way" "$long")
  per[$way]=$(( (b - a) / (long - short) ))
  echo "$way: $(( per[$way] / 1000 ))k instructions per request (runs of $short and $long: $a, $b)"
done
echo "the request service adds $(( (per[service] - per[picker]) / 1000 ))k to the picker; ext_proc, both ends, $(( (per[extproc] - per[picker]) / 1000 ))k"
