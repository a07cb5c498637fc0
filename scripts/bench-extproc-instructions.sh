#!/usr/bin/env bash
# The endpoint picker's instructions per request for an 8k-token id prompt, counted by valgrind's
# callgrind: for each of BenchmarkDecision's ways in router/extproc (hashing the prompt alone,
# the floor; the picker alone; the request service in process; through ext_proc with the Go
# gateway in the same process), the instructions per request from runs of three lengths
# (scripts/instructions.sh says how and why the runs are repeatable; each figure is printed with
# its two halves, which should agree within a few percent). scripts/bench-frontdoor-instructions.sh
# counts these beside the HTTP front door's, with the same prompt and fleet.
# Usage: scripts/bench-extproc-instructions.sh [TESTBIN] (default: builds ./router/extproc's test
# binary). Needs Debian's valgrind.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/instructions.sh
bin="${1:-}"
if [ -z "$bin" ]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  bin="$tmp/extproc.test"
  go test -c -o "$bin" ./router/extproc/
fi
declare -A per
for way in hash picker service extproc; do
  read -r p f s a b <<<"$(per_iteration "$bin" router/extproc "^BenchmarkDecision\$/^ids\$/^$way\$")"
  per[$way]=$p
  echo "$way: $(kilo "$p") instructions per request (halves $(kilo "$f"), $(kilo "$s")), $a allocations, $b B"
done
echo "the request service adds $(kilo $(( per[service] - per[picker] ))) to the picker; ext_proc, both ends, $(kilo $(( per[extproc] - per[picker] )))"
