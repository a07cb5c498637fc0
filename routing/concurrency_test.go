package routing

import (
	"math"
	"testing"
	"time"

	"github.com/prefixmesh/prefixmesh/local"
)

// The estimate counts, per own decision, the peers' new decisions received within the window
// after it: a packet continuing a split decision and a refresh of a pending one do not count.
func TestConcurrencyCountsPeerDecisions(t *testing.T) {
	c := concurrency{window: 5 * time.Millisecond}
	t0 := time.Unix(100, 0)
	c.ownDecision(t0, 0)
	at := t0.Add(time.Millisecond)
	c.peerDecision("r1", "a", 0, []uint64{1, 2}, at, time.Second)
	c.peerDecision("r1", "a", 2, []uint64{3, 4}, at, time.Second) // the same decision, continued
	c.peerDecision("r2", "b", 0, []uint64{9}, at, time.Second)
	c.peerDecision("r3", "a", 5, []uint64{7}, at, time.Second)
	c.peerDecision("r2", "b", 0, []uint64{9}, at.Add(time.Millisecond), time.Second)    // a refresh
	c.peerDecision("r4", "c", 0, []uint64{8}, t0.Add(50*time.Millisecond), time.Second) // after the window
	if got, want := c.estimate(t0.Add(time.Second)), concurrencyAlpha*3; math.Abs(got-want) > 1e-12 {
		t.Fatalf("estimate %v, want %v (three new decisions in the window)", got, want)
	}
	// Smooth traffic: no peer decision near an own one decays the estimate.
	for i := range 50 {
		c.ownDecision(t0.Add(time.Duration(2+i)*time.Second), 0)
	}
	if e := c.estimate(t0.Add(time.Minute)); e > 1e-3 {
		t.Fatalf("estimate %v after smooth traffic", e)
	}
}

// Spreading follows the water-filling of the burst's work over the costs: with two candidates at
// costs s1 < s2 and a volume V of unseen work, the level is L = (V + s1 + s2)/2 when that is
// above s2 (else s1 + V, and only the cheapest takes it), and each node takes (L − s)/(2L − s1 −
// s2) of the requests. Without concurrency the cheapest always wins.
func TestSpreadWaterFills(t *testing.T) {
	cfg := DefaultPolicyConfig()
	nodes := []NodeInfo{{ID: "a", Alive: true, PrefillTokensPerSec: 1000}, {ID: "b", Alive: true, PrefillTokensPerSec: 1000}}
	cands := []Candidate{{Node: 0, Score: 1}, {Node: 1, Score: 2}}
	matched := []int{0, 0}
	const n = 20000
	count := func(conc float64) int {
		toB := 0
		for i := range n {
			req := &Request{Hashes: []uint64{uint64(i) * 0x9e3779b97f4a7c15, uint64(i)}, PromptTokens: 1000, Concurrency: conc}
			if spread(req, nodes, matched, 0, cands, &cfg) == 1 {
				toB++
			}
		}
		return toB
	}
	if b := count(0); b != 0 {
		t.Fatalf("no concurrency: %d requests to the costlier node", b)
	}
	if b := count(0.9); b != 0 { // V = 0.9 s: L = 1.9 < s2, only the cheapest
		t.Fatalf("V below the gap: %d requests to the costlier node", b)
	}
	// V = 3 s of work (3 × 1000 tokens at 1000 tok/s): L = 3, shares 2/3 and 1/3.
	if b := float64(count(3)) / n; math.Abs(b-1.0/3) > 0.015 {
		t.Fatalf("V = 3: %.3f of the requests to the costlier node, want 1/3", b)
	}
}

// A router staggers only in bursts, and then by its name's rank among the routers: with seven
// peers and the default 5 ms slot the span is 35 ms, and the fourth router by name waits 3 of
// its 7 slots. A router without a name (not sharing) never waits.
func TestTurnsInBursts(t *testing.T) {
	d, _ := testDecider(t, DeciderConfig{})
	d.SetRouterID("router-3")
	if w := d.wait(time.Unix(100, 0)); w != 0 {
		t.Fatalf("fresh decider delays %v", w)
	}
	later := inBursts(t, d)
	if w := d.wait(later); w != 15*time.Millisecond {
		t.Fatalf("delay %v in bursts, want 15ms (rank 3 of 8 routers, 5 ms slots)", w)
	}
	// The turn counts from the burst's first decision: router-0's, received at later. A request
	// arriving 10 ms into the burst waits the 5 ms left of the turn; one arriving 20 ms in, after
	// it, none.
	d.PeerDecision("router-0", "a", 0, []uint64{999_999}, later)
	if w := d.wait(later.Add(10 * time.Millisecond)); w != 5*time.Millisecond {
		t.Fatalf("10 ms into the burst: delay %v, want the 5 ms left of the turn", w)
	}
	if w := d.wait(later.Add(20 * time.Millisecond)); w != 0 {
		t.Fatalf("20 ms into the burst, past the turn: delay %v", w)
	}
	d.SetRouterID("")
	if w := d.wait(later); w != 0 {
		t.Fatalf("a router without a name delays %v", w)
	}
}

// inBursts has d decide beside 7 peers (router-0 … router-7 but 3) deciding in the same
// instants, once a second for 40 s, and returns a time just after.
func inBursts(t *testing.T, d *Decider) time.Time {
	t.Helper()
	now := time.Unix(100, 0)
	peers := []string{"router-0", "router-1", "router-2", "router-4", "router-5", "router-6", "router-7"}
	for i := range 40 { // bursts every second: each own decision beside 7 peers' decisions
		at := now.Add(time.Duration(i) * time.Second)
		for _, p := range peers {
			d.SetPeerLoad(p, 0, 1, nil, at)
		}
		var c Choice
		if err := d.Decide(&DecideRequest{Tokens: seqTokens(64, uint32(1000*i))}, candidates(), at, CommitRecord, &c); err != nil {
			t.Fatal(err)
		}
		for p, id := range peers {
			d.PeerDecision(id, "a", 0, []uint64{uint64(i*100 + p)}, at.Add(time.Millisecond))
		}
	}
	return now.Add(39*time.Second + 500*time.Millisecond)
}

// In bursts, prefixmesh's router waits its turn only for a request whose choice the burst's other
// decisions could change: 7 peers decide beside each of its decisions, so it bounds what they
// could do by 7 requests like this one sent to the chosen node first. A 1,600-token prompt,
// nodes a and c cold, b caching some of it, nominal 10,000 tokens/s and miss penalty 10,
// nothing queued: b is cheaper than a by (1 + 10) × cached / 10,000 s, and the 7 requests would
// add 7 × uncached / 10,000 s of prefill to b (the prior fit has no decode share). b caching 160
// tokens: 0.176 s against 1.008 s, contested, wait the turn (rank 3: 15 ms). b caching 1,440:
// 1.584 s against 0.112 s, decided at once. b caching 480: 0.528 s against 0.784 s, contested,
// though the three routers ahead alone (0.336 s) could not change it: the peers behind decide
// their own uncontested requests at once, in the same instant. A cold prompt on equal nodes is always contested.
// Least-loaded's costs are not seconds: it always waits its turn.
func TestAdmissionWaitOnlyWhenTheBurstCouldChangeTheChoice(t *testing.T) {
	toks := seqTokens(1600, 7_000_000)
	for _, tc := range []struct {
		policy string
		cached int
		want   time.Duration
	}{
		{PolicyPrefixMesh, 160, 15 * time.Millisecond},
		{PolicyPrefixMesh, 1440, 0},
		{PolicyPrefixMesh, 480, 15 * time.Millisecond},
		{PolicyPrefixMesh, 0, 15 * time.Millisecond},
		{PolicyLeastLoaded, 1440, 15 * time.Millisecond},
	} {
		idx := NewIndex(DefaultIndexConfig())
		for _, id := range []string{"a", "b", "c"} {
			idx.ReplaceNode(id, 1, 1, nil)
		}
		p, err := NewPolicy(tc.policy, DefaultPolicyConfig())
		if err != nil {
			t.Fatal(err)
		}
		d, err := NewDecider(idx, NewOverlay(0, 0), p, DeciderConfig{})
		if err != nil {
			t.Fatal(err)
		}
		d.SetRouterID("router-3")
		later := inBursts(t, d)
		if tc.cached > 0 {
			idx.ReplaceNode("b", 1, 2, local.BlockHashes(toks[:tc.cached], 16, 0))
		}
		var c Choice
		w := d.AdmissionWait(&DecideRequest{Tokens: toks}, candidates(), later, &c)
		if w != tc.want {
			t.Errorf("%s, b caching %d of 1600 tokens: wait %v, want %v", tc.policy, tc.cached, w, tc.want)
		}
		if d.wait(later) != 15*time.Millisecond {
			t.Errorf("%s: the turn itself moved: %v", tc.policy, d.wait(later))
		}
	}
}

// Fast smooth traffic puts many peer decisions near each own one, but no more than its rate
// does: no stagger. The same number of peer decisions in bursts is staggered.
func TestTurnsIgnoreFastSmoothTraffic(t *testing.T) {
	for _, bursty := range []bool{false, true} {
		d, _ := testDecider(t, DeciderConfig{})
		d.SetRouterID("z") // last by name: any stagger shows
		now := time.Unix(100, 0)
		// 500 peer decisions a second, two peers; one own decision every 10 ms.
		for i := range 2000 {
			at := now.Add(time.Duration(i) * 2 * time.Millisecond)
			if bursty { // the same decisions, 100 at a time every 200 ms
				at = now.Add(time.Duration(i/100) * 200 * time.Millisecond)
			}
			if i%50 == 0 {
				d.SetPeerLoad("a", 0, 1, nil, at)
				d.SetPeerLoad("b", 0, 1, nil, at)
			}
			d.PeerDecision([]string{"a", "b"}[i%2], "a", 0, []uint64{uint64(i)}, at)
			if i%5 == 0 {
				var c Choice
				if err := d.Decide(&DecideRequest{Tokens: seqTokens(64, uint32(1000*i))}, candidates(), at, CommitRecord, &c); err != nil {
					t.Fatal(err)
				}
			}
		}
		w := d.wait(now.Add(4 * time.Second))
		if bursty && w != 10*time.Millisecond {
			t.Fatalf("bursts: delay %v, want 10ms (last of 3 routers)", w)
		}
		if !bursty && w != 0 {
			t.Fatalf("smooth traffic at 500 decisions/s: delay %v, want none", w)
		}
	}
}

// wait is the turn a request arriving at now would wait (Decider.turn's wait).
func (d *Decider) wait(now time.Time) time.Duration {
	w, _ := d.turn(now)
	return w
}
