package routing

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"
)

var t0 = time.Unix(1_700_000_000, 0)

func mustPolicy(t testing.TB, name string, cfg PolicyConfig) Policy {
	t.Helper()
	p, err := NewPolicy(name, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func fleetInfo(n int) []NodeInfo {
	nodes := make([]NodeInfo, n)
	for i := range nodes {
		nodes[i] = NodeInfo{ID: fmt.Sprintf("gpu-%02d", i), Alive: true, Model: "m", PrefillTokensPerSec: 10000,
			BlockSize: 16, CapacityBlocks: 1000, FreeBlocks: 1000}
	}
	return nodes
}

func chainOf(base uint64, n int) []uint64 {
	c := make([]uint64, n)
	for i := range c {
		c[i] = base*1_000_003 + uint64(i) + 1
	}
	return c
}

func TestPolicyNames(t *testing.T) {
	want := []string{"prefixmesh", "round-robin", "least-loaded", "chwbl", "longest-prefix", "sglang-gate", "dynamo-cost", "llm-d"}
	if !slices.Equal(PolicyNames(), want) {
		t.Fatalf("PolicyNames %v", PolicyNames())
	}
	for _, name := range want {
		if p := mustPolicy(t, name, DefaultPolicyConfig()); p.Name() != name {
			t.Fatalf("%s: Name %q", name, p.Name())
		}
	}
	if _, err := NewPolicy("random", DefaultPolicyConfig()); !errors.Is(err, ErrUnknownPolicy) {
		t.Fatalf("unknown: %v", err)
	}
	bad := DefaultPolicyConfig()
	bad.LoadFactor = 0.5
	if _, err := NewPolicy("prefixmesh", bad); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad config: %v", err)
	}
	var d Decision
	for _, name := range want {
		p := mustPolicy(t, name, DefaultPolicyConfig())
		if err := p.Choose(&Request{}, nil, nil, t0, &d); !errors.Is(err, ErrNoCandidates) {
			t.Fatalf("%s: empty: %v", name, err)
		}
		if err := p.Choose(&Request{}, fleetInfo(2), []int{0}, t0, &d); !errors.Is(err, ErrInvalid) {
			t.Fatalf("%s: short matched: %v", name, err)
		}
	}
}

func TestEligible(t *testing.T) {
	nodes := fleetInfo(6)
	nodes[1].Alive = false
	nodes[2].Draining = true
	nodes[3].Model = "other"
	pinned := map[string]bool{"gpu-00": true, "gpu-04": true, "gpu-03": true, "gpu-02": true}
	tests := []struct {
		model   string
		allowed func(string) bool
		want    []int
	}{
		{"m", nil, []int{0, 4, 5}},
		{"", nil, []int{0, 3, 4, 5}},
		{"m", func(id string) bool { return pinned[id] }, []int{0, 4}},
		{"none", nil, nil},
	}
	for _, tc := range tests {
		if got := Eligible(nodes, tc.model, tc.allowed); !slices.Equal(got, tc.want) {
			t.Fatalf("model %q: %v, want %v", tc.model, got, tc.want)
		}
	}
}

// TestBoundedLoadHotPrefix: 1,000 requests for one hot prefix, never completing. Every node that
// has served the prefix caches it, so the cheapest node is always one of those; the guard must
// keep every node within max(c × mean + 1, MinLoadBound) after every decision (c × mean + 1 for
// the pure guard and for chwbl).
func TestBoundedLoadHotPrefix(t *testing.T) {
	pure := DefaultPolicyConfig()
	pure.MinLoadBound = 0
	for _, tc := range []struct {
		name string
		cfg  PolicyConfig
	}{{PolicyPrefixMesh, DefaultPolicyConfig()}, {PolicyPrefixMesh, pure}, {PolicyCHWBL, DefaultPolicyConfig()}} {
		p := mustPolicy(t, tc.name, tc.cfg)
		floor := float64(tc.cfg.MinLoadBound)
		if tc.name == PolicyCHWBL {
			floor = 0
		}
		nodes := fleetInfo(10)
		matched := make([]int, len(nodes))
		req := &Request{Hashes: chainOf(7, 64), PromptTokens: 1024, BlockSize: 16}
		var d Decision
		hot := map[int]bool{}
		for i := 0; i < 1000; i++ {
			if err := p.Choose(req, nodes, matched, t0, &d); err != nil {
				t.Fatal(err)
			}
			nodes[d.Node].InFlight++
			matched[d.Node] = req.PromptTokens // now cached there
			hot[d.Node] = true
			total, hi := 0, 0
			for _, n := range nodes {
				total += n.InFlight
				hi = max(hi, n.InFlight)
			}
			bound := max(tc.cfg.LoadFactor*float64(total)/float64(len(nodes))+1, floor)
			if float64(hi) > bound {
				t.Fatalf("%s (floor %v): decision %d: max load %d > %.2f", tc.name, floor, i, hi, bound)
			}
		}
		t.Logf("%s (floor %v): %d nodes took the hot prefix", tc.name, floor, len(hot))
	}
}

// TestOverlayGroupsBurst: a new 8-block prefix reaches node A; its prefill is done but A's
// summary has not reached the router. A burst of requests sharing the prefix (one new block each)
// must land on A through the overlay, where without it each would pay the whole prefix elsewhere.
func TestOverlayGroupsBurst(t *testing.T) {
	const bs = 16
	prefix := chainOf(99, 8)
	route := func(withOverlay bool) []int {
		p := mustPolicy(t, PolicyPrefixMesh, DefaultPolicyConfig())
		x, o := NewIndex(DefaultIndexConfig()), NewOverlay(DefaultOverlayTTL, 0)
		nodes := fleetInfo(8)
		ids := make([]string, len(nodes))
		for i := range nodes {
			ids[i] = nodes[i].ID
			nodes[i].InFlight = 1 // background decode load
			x.ReplaceNode(ids[i], 1, 0, nil)
		}
		blocks, matched := make([]int, len(nodes)), make([]int, len(nodes))
		var d Decision
		var got []int
		for r := 0; r < 6; r++ {
			now := t0.Add(time.Duration(r) * 100 * time.Millisecond)
			hs := append(slices.Clone(prefix), uint64(5000+r))
			req := &Request{Hashes: hs, PromptTokens: len(hs) * bs, BlockSize: bs}
			x.Estimate(hs, ids, blocks)
			if withOverlay {
				o.Estimate(hs, ids, blocks, now)
			}
			for i := range blocks {
				matched[i] = blocks[i] * bs
			}
			if err := p.Choose(req, nodes, matched, now, &d); err != nil {
				t.Fatal(err)
			}
			o.Record(ids[d.Node], hs, now)
			nodes[d.Node].InFlight++
			if r > 0 {
				nodes[d.Node].InFlightPrefillTokens += req.PromptTokens - d.MatchedTokens
			} // the first request's prefill has finished when the burst arrives
			got = append(got, d.Node)
		}
		return got
	}
	with := route(true)
	for _, n := range with {
		if n != with[0] {
			t.Fatalf("with overlay the burst spread: %v", with)
		}
	}
	without := route(false)
	distinct := map[int]bool{}
	for _, n := range without {
		distinct[n] = true
	}
	if len(distinct) < 2 {
		t.Fatalf("without overlay the burst should spread (control): %v", without)
	}
}

// TestTiesDeterministic: two separate policy instances with the same view make the same choice,
// whatever the order of the nodes slice.
func TestTiesDeterministic(t *testing.T) {
	for _, name := range PolicyNames() {
		if name == PolicyRoundRobin {
			continue // stateful by definition
		}
		p1, p2 := mustPolicy(t, name, DefaultPolicyConfig()), mustPolicy(t, name, DefaultPolicyConfig())
		nodes := fleetInfo(16)
		rev := slices.Clone(nodes)
		slices.Reverse(rev)
		matched := make([]int, 16)
		spread := map[string]bool{}
		for k := uint64(1); k <= 200; k++ {
			req := &Request{Hashes: chainOf(k, 4), PromptTokens: 64, BlockSize: 16}
			var d1, d2 Decision
			if err := p1.Choose(req, nodes, matched, t0, &d1); err != nil {
				t.Fatal(err)
			}
			if err := p2.Choose(req, rev, matched, t0, &d2); err != nil {
				t.Fatal(err)
			}
			if nodes[d1.Node].ID != rev[d2.Node].ID {
				t.Fatalf("%s: key %d: %s vs %s", name, k, nodes[d1.Node].ID, rev[d2.Node].ID)
			}
			spread[nodes[d1.Node].ID] = true
		}
		if len(spread) < 12 {
			t.Fatalf("%s: ties broken onto only %d of 16 nodes", name, len(spread))
		}
	}
}

func choose(t *testing.T, p Policy, req *Request, nodes []NodeInfo, matched []int) Decision {
	t.Helper()
	var d Decision
	if err := p.Choose(req, nodes, matched, t0, &d); err != nil {
		t.Fatal(err)
	}
	if len(d.Candidates) != len(nodes) {
		t.Fatalf("%d candidates for %d nodes", len(d.Candidates), len(nodes))
	}
	return d
}

func TestPrefixMeshMinimisesTTFT(t *testing.T) {
	p := mustPolicy(t, PolicyPrefixMesh, DefaultPolicyConfig())
	req := &Request{Hashes: chainOf(3, 64), PromptTokens: 1024, BlockSize: 16}
	tests := []struct {
		name    string
		setup   func(n []NodeInfo)
		matched []int
		want    int
	}{
		{"cache wins over an equal queue", func(n []NodeInfo) {}, []int{0, 1000, 0}, 1},
		// With MissPenalty 10, 1,000 cached tokens are worth 11,000 queued ones.
		{"a short queue does not beat the cache", func(n []NodeInfo) { n[1].QueuedPrefillTokens = 9000 }, []int{0, 1000, 0}, 1},
		{"a long queue beats the cache", func(n []NodeInfo) { n[1].QueuedPrefillTokens = 12000 }, []int{0, 1000, 0}, 0},
		{"a stale report has drained", func(n []NodeInfo) {
			n[1].QueuedPrefillTokens, n[1].LoadAge = 20000, 1500*time.Millisecond
		}, []int{0, 1000, 0}, 1},
		{"own in-flight prefill is fresh", func(n []NodeInfo) {
			n[1].InFlightPrefillTokens, n[1].QueuedPrefillTokens = 12000, 3000
		}, []int{0, 1000, 0}, 0},
		{"faster node", func(n []NodeInfo) { n[2].PrefillTokensPerSec = 40000 }, []int{0, 500, 0}, 2},
		{"partial match vs queue", func(n []NodeInfo) {
			n[0].QueuedPrefillTokens, n[2].QueuedPrefillTokens = 100, 300
		}, []int{0, 0, 512}, 2},
		{"over the load bound", func(n []NodeInfo) { n[1].InFlight = 8 }, []int{0, 1000, 0}, -1},
	}
	for _, tc := range tests {
		nodes := fleetInfo(3)
		tc.setup(nodes)
		d := choose(t, p, req, nodes, tc.matched)
		if tc.want >= 0 && d.Node != tc.want {
			t.Fatalf("%s: chose %d (%+v), want %d", tc.name, d.Node, d.Candidates, tc.want)
		}
		if tc.want < 0 && (d.Node == 1 || !math.IsInf(d.Candidates[1].Score, 1)) {
			t.Fatalf("%s: chose %d (%+v)", tc.name, d.Node, d.Candidates)
		}
		if d.Reason != ReasonMinTTFT || d.MatchedTokens != tc.matched[d.Node] {
			t.Fatalf("%s: decision %+v", tc.name, d)
		}
	}
}

// TestPrefixMeshPureTTFT: with MissPenalty 0 the cost is the expected TTFT itself: the cache
// wins exactly while the queue ahead is shorter than the tokens it saves.
func TestPrefixMeshPureTTFT(t *testing.T) {
	cfg := DefaultPolicyConfig()
	cfg.MissPenalty = 0
	p := mustPolicy(t, PolicyPrefixMesh, cfg)
	req := &Request{Hashes: chainOf(3, 64), PromptTokens: 1024, BlockSize: 16}
	for _, tc := range []struct{ queued, want int }{{900, 1}, {1100, 0}} {
		nodes := fleetInfo(2)
		nodes[1].QueuedPrefillTokens = tc.queued
		d := choose(t, p, req, nodes, []int{0, 1000})
		if d.Node != tc.want {
			t.Fatalf("queued %d: chose %d (%+v)", tc.queued, d.Node, d.Candidates)
		}
		if want := float64(tc.queued+24) / 10000; math.Abs(d.Candidates[1].Score-want) > 1e-12 {
			t.Fatalf("score %v, want %v", d.Candidates[1].Score, want)
		}
	}
}

func TestPrefixMeshSessionAffinity(t *testing.T) {
	p := mustPolicy(t, PolicyPrefixMesh, DefaultPolicyConfig())
	nodes := fleetInfo(8)
	matched := make([]int, 8)
	req := &Request{Hashes: chainOf(1, 4), PromptTokens: 64, SessionKey: 0xfeed, BlockSize: 16}
	// At equal costs the session's rendezvous node wins, not the first block's.
	home := pickRendezvous(req.SessionKey, nodes, make([]Candidate, 8), func(*Candidate) bool { return true })
	if byBlock := pickRendezvous(req.Hashes[0], nodes, make([]Candidate, 8), func(*Candidate) bool { return true }); byBlock == home {
		t.Fatal("test needs a session whose node is not the first block's")
	}
	d := choose(t, p, req, nodes, matched)
	if d.Node != home || d.Reason != ReasonSession {
		t.Fatalf("chose %d (%q), want the session's node %d", d.Node, d.Reason, home)
	}
	// With the session's prefix at home it stays, for the cost's own reason.
	matched[home] = 48
	if d = choose(t, p, req, nodes, matched); d.Node != home || d.Reason != ReasonSession {
		t.Fatalf("left a home holding the prefix: %+v", d)
	}
	// A session never waits behind a queue another node would spare it: home with 20k prefill
	// tokens queued (2 s at the default rate) loses to an idle node, whose miss costs 11 × 64
	// tokens (70 ms).
	nodes[home].QueuedPrefillTokens = 20000
	if d = choose(t, p, req, nodes, matched); d.Node == home || d.Reason != ReasonMinTTFT {
		t.Fatalf("stayed home behind a queue: %+v", d)
	}
	// Over the bound, likewise.
	nodes[home].QueuedPrefillTokens = 0
	nodes[home].InFlight = 8
	if d = choose(t, p, req, nodes, matched); d.Node == home || d.Reason != ReasonMinTTFT {
		t.Fatalf("stayed home over the bound: %+v", d)
	}
}

func TestBaselines(t *testing.T) {
	cfg := DefaultPolicyConfig()
	req := &Request{Hashes: chainOf(5, 64), PromptTokens: 1024, BlockSize: 16}

	t.Run("round-robin cycles", func(t *testing.T) {
		p := mustPolicy(t, PolicyRoundRobin, cfg)
		nodes := fleetInfo(4)
		var got []int
		for i := 0; i < 8; i++ {
			got = append(got, choose(t, p, req, nodes, []int{1024, 0, 0, 0}).Node)
		}
		if fmt.Sprint(got) != "[0 1 2 3 0 1 2 3]" {
			t.Fatal(got)
		}
	})
	t.Run("least-loaded ignores the cache", func(t *testing.T) {
		p := mustPolicy(t, PolicyLeastLoaded, cfg)
		nodes := fleetInfo(3)
		nodes[0].InFlight, nodes[1].Running, nodes[2].InFlight = 2, 5, 1
		if d := choose(t, p, req, nodes, []int{1024, 1024, 0}); d.Node != 2 {
			t.Fatalf("%+v", d)
		}
		nodes[1].LoadAge = 10 * time.Second // a stale report fades
		if d := choose(t, p, req, nodes, []int{1024, 1024, 0}); d.Node != 1 {
			t.Fatalf("stale: %+v", d)
		}
	})
	t.Run("chwbl is sticky by first block until bounded", func(t *testing.T) {
		p := mustPolicy(t, PolicyCHWBL, cfg)
		nodes := fleetInfo(4)
		home := choose(t, p, req, nodes, []int{0, 0, 0, 0}).Node
		other := &Request{Hashes: append([]uint64{req.Hashes[0]}, 1, 2), PromptTokens: 48}
		if d := choose(t, p, other, nodes, []int{0, 0, 0, 0}); d.Node != home {
			t.Fatalf("same first block went to %d, not %d", d.Node, home)
		}
		for i := range nodes {
			nodes[i].InFlight = 2
		}
		nodes[home].InFlight = 4 // ceil(1.25 × 11 / 4) = 4: no room
		if d := choose(t, p, req, nodes, []int{0, 0, 0, 0}); d.Node == home {
			t.Fatalf("over the bound: %+v", d)
		}
	})
	t.Run("longest-prefix ignores load", func(t *testing.T) {
		p := mustPolicy(t, PolicyLongestPrefix, cfg)
		nodes := fleetInfo(3)
		nodes[1].InFlight = 100
		if d := choose(t, p, req, nodes, []int{16, 32, 0}); d.Node != 1 {
			t.Fatalf("%+v", d)
		}
		if d := choose(t, p, req, nodes, []int{32, 32, 0}); d.Node != 0 { // tie: least loaded
			t.Fatalf("tie %+v", d)
		}
	})
	t.Run("sglang-gate", func(t *testing.T) {
		p := mustPolicy(t, PolicySGLangGate, cfg)
		nodes := fleetInfo(3)
		nodes[0].InFlight, nodes[1].InFlight, nodes[2].InFlight = 10, 5, 0
		if d := choose(t, p, req, nodes, []int{512, 0, 0}); d.Node != 0 || d.Reason != ReasonSGLangCache {
			t.Fatalf("balanced, good match: %+v", d)
		}
		if d := choose(t, p, req, nodes, []int{100, 0, 0}); d.Node != 2 || d.Reason != ReasonSGLangLowHit {
			t.Fatalf("balanced, low match: %+v", d)
		}
		nodes[0].InFlight = 100 // 100 − 0 > 64 and 100 > 1.5 × 0
		if d := choose(t, p, req, nodes, []int{1024, 0, 0}); d.Node != 2 || d.Reason != ReasonSGLangBalance {
			t.Fatalf("imbalanced: %+v", d)
		}
	})
	t.Run("dynamo-cost", func(t *testing.T) {
		p := mustPolicy(t, PolicyDynamoCost, cfg)
		nodes := fleetInfo(3)
		// 64 request blocks. Node 0: all cached, 200 active blocks: 0 + 200 + 0 = 200.
		// Node 1: nothing cached, idle: 64 + 0 + 64 = 128. Node 2: half cached, 50 active: 32+50+32 = 114.
		nodes[0].InFlightTokens, nodes[0].InFlight = 200*16, 2
		nodes[2].InFlightTokens, nodes[2].InFlight = 50*16, 1
		nodes[1].FreeBlocks = 0 // cache occupancy is not decode load
		d := choose(t, p, req, nodes, []int{1024, 0, 512})
		if d.Node != 2 || d.Candidates[0].Score != 200 || d.Candidates[1].Score != 128 || d.Candidates[2].Score != 114 {
			t.Fatalf("%+v", d)
		}
	})
}

func TestChooseDoesNotAllocate(t *testing.T) {
	nodes := fleetInfo(64)
	matched := make([]int, 64)
	for i := range matched {
		matched[i] = (i * 37) % 1024
		nodes[i].InFlight = i % 5
		nodes[i].Running, nodes[i].LoadAge = i%7, time.Duration(i)*time.Millisecond
	}
	req := &Request{Hashes: chainOf(5, 64), PromptTokens: 1024, SessionKey: 9, BlockSize: 16}
	for _, name := range PolicyNames() {
		p := mustPolicy(t, name, DefaultPolicyConfig())
		var d Decision
		_ = p.Choose(req, nodes, matched, t0, &d)
		if n := testing.AllocsPerRun(50, func() { _ = p.Choose(req, nodes, matched, t0, &d) }); n != 0 {
			t.Fatalf("%s: %v allocations per choice", name, n)
		}
	}
}

// Eligibility is one predicate per node: listing 1,000 nodes of which the allowed set keeps one
// asks the set once per node, and nothing is scanned per node.
func TestEligibilityOnePredicatePerNode(t *testing.T) {
	const n = 1000
	nodes := make([]NodeInfo, n)
	for i := range nodes {
		nodes[i] = NodeInfo{ID: fmt.Sprintf("n%04d", i), Alive: true, Model: "m"}
	}
	set := NewNodeSet(nodes[n-1].ID)
	calls := 0
	el := Eligibility{Model: "m", Allowed: func(id string) bool { calls++; return set.Has(id) }}
	got := AppendEligible(nil, nodes, &el)
	if len(got) != 1 || got[0] != n-1 || calls != n {
		t.Fatalf("eligible %v after %d membership tests, want [%d] after %d", got, calls, n-1, n)
	}
}

// A prefill-only node never takes a whole request or a decode leg; only it takes prefill legs.
func TestEligibilityRoles(t *testing.T) {
	nodes := []NodeInfo{{ID: "b", Alive: true}, {ID: "p", Alive: true, Role: RolePrefill}, {ID: "d", Alive: true, Role: RoleDecode}}
	if got := AppendEligible(nil, nodes, &Eligibility{}); len(got) != 2 || got[0] != 0 || got[1] != 2 {
		t.Fatalf("whole requests and decode legs: %v, want both and decode", got)
	}
	if got := AppendEligible(nil, nodes, &Eligibility{Prefill: true}); len(got) != 1 || got[0] != 1 {
		t.Fatalf("prefill legs: %v, want the prefill node", got)
	}
}
