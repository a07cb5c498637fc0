#!/usr/bin/env bash
# What each door costs per request for one 8k-token-id prompt (cl100k_base's ids of the same text,
# over the same 16-node fleet in both benchmarks), in one run, beside the floor of hashing the
# prompt alone:
#
#   router/frontdoor BenchmarkOverheadPath: hash, picker (Pick and Done), first (Pick,
#     FirstToken and Done), direct (the request straight to the upstream: a simulated engine
#     that streams 8 SSE chunks after 1 ms) and front (the same through the HTTP front door);
#     the front door adds front minus direct
#   router/extproc BenchmarkDecision: picker, service (the request service in process) and
#     extproc (through ext_proc on loopback gRPC, both ends)
#
# Instructions are counted by callgrind (scripts/instructions.sh says how and why the runs are
# repeatable; each figure is printed with its two halves, which should agree within a few
# percent). Then the same front door benchmark runs natively, ROUNDS times (default 5), for
# wall-clock and CPU time per request (medians; a shared machine moves these, not the counts).
# Usage: scripts/bench-frontdoor-instructions.sh [FRONTDOOR_TESTBIN [EXTPROC_TESTBIN]] (default:
# builds both). Needs Debian's valgrind.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/instructions.sh
fbin="${1:-}" ebin="${2:-}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
if [ -z "$fbin" ]; then
  fbin="$tmp/frontdoor.test"
  go test -c -o "$fbin" ./router/frontdoor/
fi
if [ -z "$ebin" ]; then
  ebin="$tmp/extproc.test"
  go test -c -o "$ebin" ./router/extproc/
fi

declare -A per
show() { # name "PER FIRST SECOND ALLOCS BYTES"
  local p f s a b
  read -r p f s a b <<<"$2"
  per[$1]=$p
  printf '%-22s %7s instructions per request (halves %s, %s), %s allocations, %s B\n' "$1" "$(kilo "$p")" "$(kilo "$f")" "$(kilo "$s")" "$a" "$b"
}
for way in hash picker first direct front; do
  show "front door: $way" "$(per_iteration "$fbin" router/frontdoor "^BenchmarkOverheadPath\$/^$way\$/^ids8k\$")"
done
for way in picker service extproc; do
  show "ext_proc: $way" "$(per_iteration "$ebin" router/extproc "^BenchmarkDecision\$/^ids\$/^$way\$")"
done
added=$(( per["front door: front"] - per["front door: direct"] ))
picker=${per["front door: picker"]}
echo "the HTTP front door adds $(kilo "$added") instructions per request:" \
  "$(awk -v a="$added" -v p="$picker" -v h="${per["front door: hash"]}" 'BEGIN { printf "%.2f× the picker, %.2f× hashing the prompt", a / p, a / h }')"

rounds=${ROUNDS:-5}
(cd router/frontdoor && "$fbin" -test.run '^$' -test.bench '^BenchmarkOverheadPath$' -test.benchtime "${BENCHTIME:-1000x}" \
  -test.count "$rounds" -test.benchmem) >"$tmp/native"
awk '/^BenchmarkOverheadPath/ {
    split($1, p, "/"); w = p[2]
    for (k = 2; k <= NF; k++) { if ($k == "ns/op") ns[w, ++n[w]] = $(k-1); if ($k == "cpu-µs/op") cpu[w, n[w]] = $(k-1) }
  }
  function median(a, w, m,   i, j, t, v) {
    for (i = 1; i <= m; i++) v[i] = a[w, i]
    for (i = 2; i <= m; i++) for (j = i; j > 1 && v[j-1] > v[j]; j--) { t = v[j]; v[j] = v[j-1]; v[j-1] = t }
    return v[int((m + 1) / 2)]
  }
  END {
    split("hash picker first direct front", ws, " ")
    for (i = 1; i <= 5; i++) { w = ws[i]; if (!n[w]) continue
      printf "native %-7s %9.1f µs per request, %8.1f µs CPU (medians of %d runs)\n", w, median(ns, w, n[w]) / 1000, median(cpu, w, n[w]), n[w] }
    printf "native: the front door adds %.1f µs of CPU per request (median front minus median direct)\n", median(cpu, "front", n["front"]) - median(cpu, "direct", n["direct"])
  }' "$tmp/native"
