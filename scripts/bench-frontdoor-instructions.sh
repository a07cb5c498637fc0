#!/usr/bin/env bash
# The front door's instructions per request for an 8k-token id prompt, counted by valgrind's
# callgrind (repeatable for the same binary and inputs, whatever else the machine is doing):
# for each path (direct to the upstream, through the front door), the whole process's count at
# two run lengths; their difference over the extra requests is one request's cost, and the
# front door's is front minus direct. Usage: scripts/bench-frontdoor-instructions.sh [TESTBIN]
# (default: builds ./router/frontdoor's test binary). Needs Debian's valgrind. Go's signal-based
# preemption is turned off (GODEBUG=asyncpreemptoff=1): callgrind cannot follow it.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-}"
if [ -z "$bin" ]; then
  bin="$(mktemp -d)/frontdoor.test"
  go test -c -o "$bin" ./router/frontdoor/
fi
short=50 long=250
count() { # path n → instructions of the whole run
  local out
  out="$(mktemp -d)"
  (cd router/frontdoor && GODEBUG=asyncpreemptoff=1 GOMAXPROCS=1 valgrind --tool=callgrind --callgrind-out-file="$out/cg" \
    "$bin" -test.run '^$' -test.bench "OverheadPath/$1/ids8k" -test.benchtime "${2}x" >/dev/null 2>"$out/log")
  grep -m1 -o 'Collected : [0-9]*' "$out/log" | grep -o '[0-9]*'
  rm -rf "$out"
}
declare -A per
for path in direct front; do
  a=$(count "$path" "$short")
  b=$(count "$path" "$long")
  per[$path]=$(( (b - a) / (long - short) ))
  echo "$path: $(( per[$path] / 1000 ))k instructions per request (runs of $short and $long: $a, $b)"
done
echo "front door adds: $(( (per[front] - per[direct]) / 1000 ))k instructions per request"
