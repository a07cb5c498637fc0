# Sourced by scripts/bench-*-instructions.sh: one benchmark's instructions per iteration, counted
# by valgrind's callgrind (a count the machine's load does not move).
#
# per_iteration BIN DIR BENCH runs BIN's benchmark BENCH (an anchored -test.bench pattern) in DIR
# under callgrind at three lengths (SHORT, MID and LONG iterations; default 50, 150, 250) and
# prints "PER FIRST SECOND ALLOCS BYTES": the instructions per iteration over the whole span, then
# over each half (they should agree within a few percent: if they do not, something other than the
# iterations ran), and the allocations and bytes per iteration of the longest run (-benchmem).
# Whatever a run does once (the process's start, the benchmark's setup, warm-up) cancels out of
# the differences. How the runs are made repeatable:
#
#   - GODEBUG=cpu.rdtscp=off: valgrind's CPU model announces RDTSCP, which the Go runtime's
#     cputicks then executes, and a host without it (some virtual machines) gets SIGILL from
#     valgrind, at a moment that depends on lock contention: a run that died early still printed
#     a count, which is how two runs could disagree by a factor. A run is taken only when the
#     benchmark printed its result and the process exited 0.
#   - GOGC=off: a collection marks the setup's heap (the tokenizer's tables), tens of millions of
#     instructions that land in one run and not in another of a different length. What a request
#     leaves to the collector is its allocation, reported beside the count.
#   - GODEBUG=asyncpreemptoff=1: callgrind cannot follow the signal-based preemption.
#   - GOMAXPROCS=1: valgrind runs one thread at a time anyway; one P keeps the scheduler's
#     choices the same from run to run.
#
# Needs Debian's valgrind.

SHORT=${SHORT:-50}
MID=${MID:-150}
LONG=${LONG:-250}

# callgrind_run BIN DIR BENCH N → "INSTRUCTIONS ALLOCS BYTES" of one run of N iterations.
callgrind_run() {
  local bin=$1 dir=$2 bench=$3 n=$4 out rc=0
  out="$(mktemp -d)"
  (cd "$dir" && GOGC=off GODEBUG=asyncpreemptoff=1,cpu.rdtscp=off GOMAXPROCS=1 \
    valgrind --tool=callgrind --callgrind-out-file="$out/cg" \
    "$bin" -test.run '^$' -test.bench "$bench" -test.benchtime "${n}x" -test.benchmem \
    >"$out/stdout" 2>"$out/log") || rc=$?
  if [ "$rc" -ne 0 ] || ! grep -q '^PASS' "$out/stdout" || grep -q 'Unrecognised instruction' "$out/log"; then
    echo "instructions: $bench ($n iterations) did not run to its end under valgrind (exit $rc):" >&2
    tail -n 20 "$out/log" "$out/stdout" >&2
    rm -rf "$out"
    return 1
  fi
  local count line
  count="$(grep -m1 -o 'Collected : [0-9]*' "$out/log" | grep -o '[0-9]*')"
  line="$(grep -m1 "^Benchmark" "$out/stdout")"
  echo "$count $(awk '{ for (k = 2; k <= NF; k++) { if ($k == "allocs/op") a = $(k-1); if ($k == "B/op") b = $(k-1) } } END { print a + 0, b + 0 }' <<<"$line")"
  rm -rf "$out"
}

per_iteration() {
  local bin=$1 dir=$2 bench=$3 a m z
  a="$(callgrind_run "$bin" "$dir" "$bench" "$SHORT")" || return 1
  m="$(callgrind_run "$bin" "$dir" "$bench" "$MID")" || return 1
  z="$(callgrind_run "$bin" "$dir" "$bench" "$LONG")" || return 1
  read -r ca _ _ <<<"$a"
  read -r cm _ _ <<<"$m"
  read -r cz allocs bytes <<<"$z"
  echo "$(( (cz - ca) / (LONG - SHORT) )) $(( (cm - ca) / (MID - SHORT) )) $(( (cz - cm) / (LONG - MID) )) $allocs $bytes"
}

# kilo N → N in thousands, rounded.
kilo() { echo "$(( ($1 + 500) / 1000 ))k"; }
