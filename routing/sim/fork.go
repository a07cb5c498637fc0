package sim

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"time"
)

// A forked-conversation trace: agent fan-out. An orchestrating agent works in one long context
// (a system prompt, tool definitions, the task, the documents or code it read: its prefix), asks
// the model for a plan (the root request), then fans out: many sub-agents or tool-call branches,
// each the same context plus its own short instruction, sent at once (a map over a list of
// files, candidate answers sampled in parallel, best-of-n). Every branch shares the whole long
// prefix with the root and its siblings and arrives within a short burst, far more at once than
// one node's load guard lets it take; the nodes the rest spill to lack the prefix, the case
// peer pull is for.

// ForkOptions shape a forked-conversation trace (ForkTrace). Each fork k starts at k·Gap: its
// root request (Prefix tokens unique to the fork, then a suffix) arrives first, its Branches
// Lead later, each at a uniformly drawn offset within Burst, each the fork's prefix and a unique
// suffix; suffix and output lengths are drawn uniformly from their ranges.
type ForkOptions struct {
	Forks, Prefix, Branches int
	SuffixMin, SuffixMax    int
	OutputMin, OutputMax    int
	RootOutput              int
	Lead, Burst, Gap        time.Duration
	Seed                    uint64
}

// DefaultForkOptions is the fan-out `router sim --trace fork` replays. A 12,288-token prefix is
// an agent's context after some tool output (coding agents' contexts run from 8k tokens up);
// 32 branches each with 256–512 tokens of its own is a wide map step, and 16–64 output tokens a
// tool call or a short verdict. The branches come 2 s after the root (its prefill, 1.2 s on one
// node, and some of its plan decoded) within 200 ms (a client launching them in a loop), and a
// fork every 4 s keeps 8 nodes busy without piling up: a fork's work is the prefix once per node
// that computes it plus about 12k tokens of suffixes, and a node prefills 10,000 tokens a second.
func DefaultForkOptions() ForkOptions {
	return ForkOptions{Forks: 24, Prefix: 12288, Branches: 32, SuffixMin: 256, SuffixMax: 512,
		OutputMin: 16, OutputMax: 64, RootOutput: 64, Lead: 2 * time.Second, Burst: 200 * time.Millisecond,
		Gap: 4 * time.Second}
}

// maxForkRequests bounds a generated trace (forks × (branches + 1)), as a replayed trace file is
// bounded by its length: a typo in a spec should not fill memory.
const maxForkRequests = 1 << 20

// Validate reports whether o makes a trace.
func (o ForkOptions) Validate() error {
	switch {
	case o.Forks <= 0 || o.Branches <= 0 || o.Prefix <= 0:
		return fmt.Errorf("%w: fork: forks %d, branches %d and prefix %d must be positive", ErrBadTrace, o.Forks, o.Branches, o.Prefix)
	case o.Forks*(o.Branches+1) > maxForkRequests:
		return fmt.Errorf("%w: fork: %d forks × %d branches is over %d requests", ErrBadTrace, o.Forks, o.Branches, maxForkRequests)
	case o.SuffixMin < 1 || o.SuffixMax < o.SuffixMin || o.OutputMin < 0 || o.OutputMax < o.OutputMin || o.RootOutput < 0:
		return fmt.Errorf("%w: fork: suffix %d-%d (at least 1) and output %d-%d, root output %d", ErrBadTrace,
			o.SuffixMin, o.SuffixMax, o.OutputMin, o.OutputMax, o.RootOutput)
	case o.Prefix+o.SuffixMax >= 1_000_000:
		return fmt.Errorf("%w: fork: prompts of %d tokens", ErrBadTrace, o.Prefix+o.SuffixMax) // a segment's token index stays under 1e6
	case o.Lead < 0 || o.Burst < 0 || o.Gap < 0:
		return fmt.Errorf("%w: fork: negative lead, burst or gap", ErrBadTrace)
	}
	return nil
}

// Segment ids of fork traces: 2^57 plus the fork (prefixes); 2^57 + 2^40 plus fork·2^20 + branch
// (suffixes; the root's branch is 2^20 − 1). appendSegment's tokens depend on id·10^6 mod
// 2^64, so ids equal modulo 2^58 would repeat each other's tokens: 2^57 keeps these clear of
// Mooncake's small block ids and of the Azure structure's ids (multiples of 2^58 plus small).
const (
	segFork       = 1 << 57
	segForkSuffix = segFork + 1<<40
	forkBranches  = 1<<20 - 1 // at most this many branches a fork (the root takes the last id)
)

// Fork generates the trace o describes; the same o gives the same trace. Requests are sorted by
// arrival, a fork's root before its branches; no request has a session key (the branches are
// separate conversations from the router's point of view).
func Fork(o ForkOptions) (*Trace, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Branches > forkBranches {
		return nil, fmt.Errorf("%w: fork: %d branches, at most %d", ErrBadTrace, o.Branches, forkBranches)
	}
	rng := rand.New(rand.NewPCG(o.Seed, 0xf0f0))
	between := func(lo, hi int) int { return lo + rng.IntN(hi-lo+1) }
	tr := &Trace{Requests: make([]Request, 0, o.Forks*(o.Branches+1))}
	for k := 0; k < o.Forks; k++ {
		start := time.Duration(k) * o.Gap
		prefix := appendSegment(make([]uint32, 0, o.Prefix), segFork+uint64(k), o.Prefix)
		prompt := func(branch int) []uint32 {
			n := between(o.SuffixMin, o.SuffixMax)
			t := append(make([]uint32, 0, o.Prefix+n), prefix...)
			return appendSegment(t, segForkSuffix+uint64(k)<<20+uint64(branch), n)
		}
		tr.Requests = append(tr.Requests, Request{Arrival: start, Tokens: prompt(forkBranches), OutputTokens: o.RootOutput})
		for b := 0; b < o.Branches; b++ {
			at := start + o.Lead
			if o.Burst > 0 {
				at += time.Duration(rng.Int64N(int64(o.Burst)))
			}
			tr.Requests = append(tr.Requests, Request{Arrival: at, Tokens: prompt(b), OutputTokens: between(o.OutputMin, o.OutputMax)})
		}
	}
	sort.SliceStable(tr.Requests, func(i, j int) bool { return tr.Requests[i].Arrival < tr.Requests[j].Arrival })
	return tr, nil
}

// ForkTrace is `router sim --trace fork[:key=value,…]`: DefaultForkOptions with the spec's keys
// (forks, prefix, branches, suffix and output as lo-hi or one number, root-output; lead, burst
// and gap as Go durations; seed, default opt.Seed), then opt's Speed (arrivals divided) and Limit
// (the first requests) as for a trace file.
func ForkTrace(spec string, opt ReadOptions) (*Trace, error) {
	o, err := ParseFork(spec, opt.Seed)
	if err != nil {
		return nil, err
	}
	tr, err := Fork(o)
	if err != nil {
		return nil, err
	}
	if opt.Limit > 0 && opt.Limit < len(tr.Requests) {
		tr.Requests = tr.Requests[:opt.Limit]
	}
	if opt.Speed > 0 && opt.Speed != 1 {
		for i := range tr.Requests {
			tr.Requests[i].Arrival = time.Duration(float64(tr.Requests[i].Arrival) / opt.Speed)
		}
	}
	return tr, nil
}

// ParseFork reads a fork spec: "fork", or "fork:" and comma-separated key=value pairs over
// DefaultForkOptions (seed defaulting to seed).
func ParseFork(spec string, seed uint64) (ForkOptions, error) {
	o := DefaultForkOptions()
	o.Seed = seed
	rest, ok := strings.CutPrefix(spec, "fork")
	if !ok || rest != "" && rest[0] != ':' {
		return o, fmt.Errorf("%w: fork spec %q: want fork or fork:key=value,…", ErrBadTrace, spec)
	}
	rest = strings.TrimPrefix(rest, ":")
	for _, kv := range strings.Split(rest, ",") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return o, fmt.Errorf("%w: fork spec: %q is not key=value", ErrBadTrace, kv)
		}
		var err error
		switch k {
		case "forks":
			o.Forks, err = strconv.Atoi(v)
		case "prefix":
			o.Prefix, err = strconv.Atoi(v)
		case "branches":
			o.Branches, err = strconv.Atoi(v)
		case "suffix":
			o.SuffixMin, o.SuffixMax, err = parseRange(v)
		case "output":
			o.OutputMin, o.OutputMax, err = parseRange(v)
		case "root-output":
			o.RootOutput, err = strconv.Atoi(v)
		case "lead":
			o.Lead, err = time.ParseDuration(v)
		case "burst":
			o.Burst, err = time.ParseDuration(v)
		case "gap":
			o.Gap, err = time.ParseDuration(v)
		case "seed":
			o.Seed, err = strconv.ParseUint(v, 10, 64)
		default:
			return o, fmt.Errorf("%w: fork spec: unknown key %q (forks, prefix, branches, suffix, output, root-output, lead, burst, gap, seed)", ErrBadTrace, k)
		}
		if err != nil {
			return o, fmt.Errorf("%w: fork spec: %s: %v", ErrBadTrace, k, err)
		}
	}
	return o, o.Validate()
}

// parseRange reads "lo-hi" or "n" (lo = hi = n).
func parseRange(v string) (lo, hi int, err error) {
	a, b, ok := strings.Cut(v, "-")
	if lo, err = strconv.Atoi(a); err != nil || !ok {
		return lo, lo, err
	}
	hi, err = strconv.Atoi(b)
	return lo, hi, err
}
