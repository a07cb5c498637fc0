package sim

import (
	"fmt"
	"math/rand/v2"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prefixmesh/prefixmesh/local"
	"github.com/prefixmesh/prefixmesh/local/kvpool"
	"github.com/prefixmesh/prefixmesh/routing"
)

// The simulated node runs the node agent's code: the cache is a *local.RadixTree and the engine's
// memory a *kvpool.Pool, the types the node agent and its simulated engine use.
var (
	_ *local.RadixTree = (&node{}).tree
	_ *kvpool.Pool     = (&node{}).pool
)

// testTrace builds a Mooncake-format trace of n requests, spacing apart, whose prompts share
// prefixes: each starts with 1–6 blocks of one of 12 chains of "documents", then 0–2 blocks of
// its own, the last block cut short.
func testTrace(t *testing.T, seed uint64, n int, spacing time.Duration) *Trace {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 9))
	var b strings.Builder
	next := int64(1 << 20)
	for i := 0; i < n; i++ {
		fam := int64(rng.IntN(12))
		var ids []string
		for k := 0; k < 1+rng.IntN(6); k++ {
			ids = append(ids, fmt.Sprint(fam*100+int64(k)))
		}
		for k := rng.IntN(3); k > 0; k-- {
			next++
			ids = append(ids, fmt.Sprint(next))
		}
		in := len(ids)*MooncakeBlockTokens - rng.IntN(MooncakeBlockTokens)
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": %d, "output_length": %d, "hash_ids": [%s]}`+"\n",
			int64(i)*spacing.Milliseconds(), in, 1+rng.IntN(100), strings.Join(ids, ", "))
	}
	tr, err := ReadMooncake(strings.NewReader(b.String()), ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// smallConfig is a fleet small enough that the test traces make it evict.
func smallConfig() Config {
	cfg := DefaultConfig()
	cfg.Nodes = 4
	cfg.BlocksPerNode = 1024 // 16k tokens: about five prompts
	return cfg
}

func run(t *testing.T, tr *Trace, policy string, cfg Config) (Result, *Sim) {
	t.Helper()
	s, err := New(tr, policy, cfg)
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.Run()
	if err != nil {
		t.Fatal(err)
	}
	return r, s
}

// TestZeroDelayExact: with no propagation delay and one request at a time, the router's index is
// exactly the node's tree, so the estimate for the chosen node equals its actual match.
func TestZeroDelayExact(t *testing.T) {
	tr := testTrace(t, 1, 400, 100*time.Second) // far apart: each finishes before the next, overlay expired
	cfg := smallConfig()
	cfg.Delay = 0
	r, s := run(t, tr, routing.PolicyLongestPrefix, cfg)
	if r.EstimateExactShare != 1 || r.EstimateMAETokens != 0 {
		t.Fatalf("exact share %v, MAE %v; want 1 and 0", r.EstimateExactShare, r.EstimateMAETokens)
	}
	if r.HitRatio < 0.3 {
		t.Fatalf("hit ratio %v: the trace shares prefixes, longest-prefix should find them", r.HitRatio)
	}
	var evicted uint64
	for _, n := range s.nodes {
		evicted += n.pool.Stats().Evicted
		if err := n.pool.Check(); err != nil {
			t.Fatal(err)
		}
		if n.pool.Stats().Running != 0 {
			t.Fatal("sequences left running")
		}
	}
	if evicted == 0 {
		t.Fatal("no evictions: the test does not exercise Removed events")
	}
	if r.Served != len(tr.Requests) {
		t.Fatalf("served %d of %d", r.Served, len(tr.Requests))
	}
}

// TestZeroDelayExactStandardTrace is TestZeroDelayExact on the first 300 requests of the
// standard trace, re-spaced to one at a time, on the standard fleet.
func TestZeroDelayExactStandardTrace(t *testing.T) {
	f, err := os.Open("../../data/traces/synthetic_trace.jsonl")
	if err != nil {
		t.Fatalf("standard trace (shipped in data/traces): %v", err)
	}
	defer f.Close()
	tr, err := ReadMooncake(f, ReadOptions{Limit: 300})
	if err != nil {
		t.Fatal(err)
	}
	for i := range tr.Requests {
		tr.Requests[i].Arrival = time.Duration(i) * time.Hour
	}
	cfg := DefaultConfig()
	cfg.Delay = 0
	r, _ := run(t, tr, routing.PolicyLongestPrefix, cfg)
	if r.EstimateExactShare != 1 || r.EstimateMAETokens != 0 || r.HitRatio == 0 {
		t.Fatalf("exact share %v, MAE %v, hit ratio %v", r.EstimateExactShare, r.EstimateMAETokens, r.HitRatio)
	}
}

// TestDelayIsApplied: summaries that arrive only after the next request (spaced well beyond the
// overlay's TTL) leave the router blind, so its estimates fall short of the nodes' real matches.
func TestDelayIsApplied(t *testing.T) {
	tr := testTrace(t, 1, 100, 100*time.Second)
	cfg := smallConfig()
	cfg.Delay = 150 * time.Second
	r, _ := run(t, tr, routing.PolicyLongestPrefix, cfg)
	if r.EstimateExactShare == 1 || r.EstimateMAETokens == 0 {
		t.Fatalf("exact share %v, MAE %v with summaries later than the next request", r.EstimateExactShare, r.EstimateMAETokens)
	}
}

// TestDeterministic: the same inputs give the same result, including every TTFT, with loss.
func TestDeterministic(t *testing.T) {
	tr := testTrace(t, 2, 300, 150*time.Millisecond)
	cfg := smallConfig()
	cfg.Loss, cfg.Seed = 0.1, 7
	for _, p := range routing.PolicyNames() {
		a, _ := run(t, tr, p, cfg)
		b, _ := run(t, tr, p, cfg)
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("%s: two runs differ:\n%+v\n%+v", p, a, b)
		}
	}
}

// TestPoliciesAndReferences runs every policy under load and checks the invariants that hold
// whatever the policy: everything is served, nothing is lost, no policy beats an infinite cache.
func TestPoliciesAndReferences(t *testing.T) {
	tr := testTrace(t, 3, 500, 80*time.Millisecond)
	cfg := smallConfig()
	ref, err := References(tr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !(ref.PooledLRUHitRatio > 0 && ref.PooledLRUHitRatio <= ref.InfiniteHitRatio && ref.InfiniteHitRatio < 1) {
		t.Fatalf("references %+v", ref)
	}
	for _, p := range routing.PolicyNames() {
		r, s := run(t, tr, p, cfg)
		if r.Name != p || r.Served != len(tr.Requests) || len(r.TTFTs) != r.Served {
			t.Fatalf("%s: served %d of %d", p, r.Served, len(tr.Requests))
		}
		if r.HitRatio > ref.InfiniteHitRatio+1e-12 {
			t.Fatalf("%s: hit ratio %v above the infinite cache's %v", p, r.HitRatio, ref.InfiniteHitRatio)
		}
		if !(r.TTFTP50 <= r.TTFTP99 && r.TTFTMean <= r.E2EMean && r.ImbalancePrefill >= 1) {
			t.Fatalf("%s: inconsistent metrics %+v", p, r)
		}
		for _, n := range s.nodes {
			if l := s.routers[0].dec.OwnInFlight(n.id); l != (routing.InFlight{}) {
				t.Fatalf("%s: node %s: router still counts %+v in flight", p, n.id, l)
			}
		}
	}
	// A pooled cache that never runs out is the infinite cache.
	big := cfg
	big.BlocksPerNode = 1 << 20
	if r2, _ := References(tr, big); r2.PooledLRUHitRatio != r2.InfiniteHitRatio {
		t.Fatalf("unbounded pooled %v != infinite %v", r2.PooledLRUHitRatio, r2.InfiniteHitRatio)
	}
}

// TestReferencesByHand: A, A, B with A two blocks plus a partial one: the second A matches its two
// full blocks (the partial tail never counts), B nothing.
func TestReferencesByHand(t *testing.T) {
	a, _ := ExpandMooncake([]int64{1}, 40)
	b, _ := ExpandMooncake([]int64{2}, 40)
	tr := &Trace{Requests: []Request{{Tokens: a}, {Tokens: a, Arrival: time.Second}, {Tokens: b, Arrival: 2 * time.Second}}}
	cfg := DefaultConfig()
	ref, err := References(tr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := 32.0 / 120
	if ref.InfiniteHitRatio != want || ref.PooledLRUHitRatio != want {
		t.Fatalf("%+v, want both %v", ref, want)
	}
}

// TestLossRepairs: lost deltas leave gaps that the router repairs from snapshots; routing keeps
// working and the index converges (at the end it equals every node's summary).
func TestLossRepairs(t *testing.T) {
	tr := testTrace(t, 4, 300, 100*time.Millisecond)
	cfg := smallConfig()
	cfg.Loss, cfg.Seed = 0.3, 1
	r, s := run(t, tr, routing.PolicyPrefixMesh, cfg)
	if r.Served != len(tr.Requests) {
		t.Fatalf("served %d", r.Served)
	}
	if r.Repairs == 0 {
		t.Fatal("no repairs with 30% loss")
	}
	for _, n := range s.nodes {
		_, seq, blocks, _ := s.routers[0].index.NodeState(n.id)
		snap, head := n.tree.SummarySnapshot(nil)
		if seq != head || blocks != len(snap) {
			t.Fatalf("%s: index at seq %d with %d blocks, node at %d with %d", n.id, seq, blocks, head, len(snap))
		}
	}
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	for _, mut := range []func(*Config){
		func(c *Config) { c.Nodes = 0 },
		func(c *Config) { c.BlockSize = 0 },
		func(c *Config) { c.PrefillTokensPerSec = 0 },
		func(c *Config) { c.MaxConcurrent = -1 },
		func(c *Config) { c.Delay = -time.Second },
		func(c *Config) { c.Loss = 1 },
	} {
		c := DefaultConfig()
		mut(&c)
		if _, err := New(&Trace{}, "", c); err == nil {
			t.Fatalf("accepted %+v", c)
		}
	}
	if _, err := New(&Trace{}, "no-such-policy", DefaultConfig()); err == nil {
		t.Fatal("accepted an unknown policy")
	}
}
