#!/usr/bin/env bash
# The request service's whole routing decision against hashing the prompt, over 64 nodes listed
# as the router lists them (the gossip mirror through MirrorNodes, passive health as ejector) with
# ~300 recent chains in the overlay: ROUNDS (default 20) runs of BenchmarkPickDecision's "paired"
# sub-benchmarks, which time hashing and the decision alternately, one of each per iteration.
# Prints each round, then the median and range of decision/hash and of the decision's time per
# prompt size. On a shared machine single runs move by a third; the median over rounds is the
# figure to quote.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-20}
bin=$(mktemp)
out=$(mktemp)
trap 'rm -f "$bin" "$out"' EXIT
go test -c -o "$bin" ./router/requests/
for i in $(seq "$rounds"); do
  "$bin" -test.run '^$' -test.bench 'PickDecision/(8k|64k)/paired$' -test.benchtime "${BENCHTIME:-2000x}" |
    awk -v r="$i" '/paired/ { for (k = 1; k <= NF; k++) { if ($k == "decision/hash") q = $(k-1); if ($k == "decision-ns/op") d = $(k-1) }
      split($1, p, "/"); printf "round %d %s decision/hash %s decision %.1f us\n", r, p[2], q, d/1000 }' | tee -a "$out"
done
for size in 8k 64k; do
  grep " $size " "$out" | awk -v s="$size" '{ q[NR] = $5; d[NR] = $7 } END {
    n = NR; asort_q(q, n); asort_q(d, n); m = int((n + 1) / 2)
    printf "%s: decision/hash median %.2f (%.2f-%.2f), decision median %.1f us (%.1f-%.1f), %d rounds\n", s, q[m], q[1], q[n], d[m], d[1], d[n], n }
    function asort_q(a, n,   i, j, t) { for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] > a[j]; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t } }'
done
