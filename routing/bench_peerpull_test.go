package routing

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/prefixmesh/prefixmesh/local"
)

// The whole decision of a request under P/D with peer pull, against hashing its prompt (the
// floor: Decide hashes it once). 64 decode nodes and a prefill pool of 8, each holding 20,000
// blocks of its own; decode node i also holds the prompt's first i × 8 blocks and queues i × 4,000
// prefill tokens (the longer a node's prefix, the busier it is), every prefill node holds the
// first 256 blocks and queues 100,000; ~300 recent chains sharing the prompt's first half sit in
// the overlay on random decode nodes. So Decide chooses a lightly loaded node holding little,
// PlanPrefill keeps the prefill on it (the prefill pool is 10 s behind), and PlanPeerPull pulls
// the longest run, decode node 63's 8,064 tokens, onto it. Each iteration commits (CommitBegin)
// and then abandons the request (Done, not ok, before a first token: the overlay takes its
// prefix back), so every iteration decides from the same state.
type peerPullBench struct {
	d       *Decider
	tokens  []uint32
	decode  []NodeInfo
	prefill []NodeInfo
	now     time.Time
}

func newPeerPullBench(b *testing.B) *peerPullBench {
	b.Helper()
	const own = 20_000
	rng := rand.New(rand.NewPCG(7, 7))
	tokens := make([]uint32, benchPrompt)
	for i := range tokens {
		tokens[i] = uint32(i*7919) % 100000
	}
	hashes := local.BlockHashes(tokens, benchBlockSize, 0)
	idx := NewIndex(IndexConfig{MaxPairs: 80 * (own + len(hashes))})
	blocks := func(prefix []uint64) []uint64 {
		out := append(make([]uint64, 0, len(prefix)+own), prefix...)
		for range own {
			out = append(out, rng.Uint64())
		}
		return out
	}
	s := &peerPullBench{tokens: tokens, now: time.Unix(1000, 0)}
	for i := range benchNodes {
		id := fmt.Sprintf("decode-%02d", i)
		idx.ReplaceNode(id, 1, 0, blocks(hashes[:i*len(hashes)/benchNodes]))
		s.decode = append(s.decode, NodeInfo{ID: id, Alive: true, BlockSize: benchBlockSize, QueuedPrefillTokens: i * 4000})
	}
	for i := range 8 {
		id := fmt.Sprintf("prefill-%d", i)
		idx.ReplaceNode(id, 1, 0, blocks(hashes[:256]))
		s.prefill = append(s.prefill, NodeInfo{ID: id, Alive: true, Role: RolePrefill, BlockSize: benchBlockSize, QueuedPrefillTokens: 100_000})
	}
	o := NewOverlay(DefaultOverlayTTL, DefaultOverlayMaxEntries)
	for range 300 {
		chain := append([]uint64(nil), hashes[:len(hashes)/2]...)
		for len(chain) < len(hashes) {
			chain = append(chain, rng.Uint64())
		}
		o.Record(s.decode[rng.IntN(benchNodes)].ID, chain, s.now)
	}
	pol, _ := NewPolicy(PolicyPrefixMesh, DefaultPolicyConfig())
	d, err := NewDecider(idx, o, pol, DeciderConfig{})
	if err != nil {
		b.Fatal(err)
	}
	s.d = d
	return s
}

// decide is one whole decision: Decide, PlanPrefill and, with the prefill on the decode node,
// PlanPeerPull, committed as commit says; a committed request is then abandoned. Without plans,
// Decide alone.
func (s *peerPullBench) decide(b *testing.B, req *DecideRequest, c *Choice, commit Commit, plans bool) PeerPull {
	if err := s.d.Decide(req, s.decode, s.now, commit, c); err != nil {
		b.Fatal(err)
	}
	pp := PeerPull{Source: -1}
	if plans {
		pf := s.d.PlanPrefill(req, &s.decode[c.Node], c, s.prefill, DisaggAuto, s.now, commit)
		if pf.Node < 0 {
			pp = s.d.PlanPeerPull(req, s.decode, c)
		}
		if pf.Ticket != nil {
			pf.Ticket.Done(s.now, false)
		}
	}
	if c.Ticket != nil {
		c.Ticket.Done(s.now, false)
	}
	return pp
}

// BenchmarkPeerPullDecision: "decision" is the whole decision, committed (CommitBegin, as the
// front door commits), "dry" the same uncommitted (CommitNone), "decide" Decide alone,
// committed, and "peerpull" PlanPeerPull alone on a decided Choice; each alone with -benchmem. "paired" times, in every iteration, hashing the prompt,
// Decide alone, the decision and the dry decision one after another, and reports each against
// hashing (decide/hash, decision/hash, dry/hash): on a shared machine only timings taken
// microseconds apart compare. Decide hashes the prompt once itself, so 1 is the floor.
func BenchmarkPeerPullDecision(b *testing.B) {
	s := newPeerPullBench(b)
	req := &DecideRequest{Tokens: s.tokens}
	var c Choice
	if pp := s.decide(b, req, &c, CommitBegin, true); pp.Source != benchNodes-1 || pp.Tokens == 0 {
		b.Fatalf("the scenario does not pull from the longest holder: %+v", pp)
	}
	for _, v := range []struct {
		name   string
		commit Commit
		plans  bool
	}{{"decision", CommitBegin, true}, {"dry", CommitNone, true}, {"decide", CommitBegin, false}} {
		b.Run(v.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				s.decide(b, req, &c, v.commit, v.plans)
			}
		})
	}
	b.Run("peerpull", func(b *testing.B) { // PlanPeerPull alone, on a dry decision's Choice
		var dc Choice
		s.decide(b, req, &dc, CommitNone, false)
		b.ReportAllocs()
		for b.Loop() {
			s.d.PlanPeerPull(req, s.decode, &dc)
		}
	})
	b.Run("paired", func(b *testing.B) {
		dst := make([]uint64, 0, benchPrompt/benchBlockSize)
		var hashing, deciding, whole, dry time.Duration
		for b.Loop() {
			t0 := time.Now()
			dst = local.AppendBlockHashes(dst[:0], s.tokens, benchBlockSize, 0)
			t1 := time.Now()
			s.decide(b, req, &c, CommitBegin, false)
			t2 := time.Now()
			s.decide(b, req, &c, CommitBegin, true)
			t3 := time.Now()
			s.decide(b, req, &c, CommitNone, true)
			hashing, deciding, whole, dry = hashing+t1.Sub(t0), deciding+t2.Sub(t1), whole+t3.Sub(t2), dry+time.Since(t3)
		}
		b.ReportMetric(float64(hashing.Nanoseconds())/float64(b.N), "hash-ns/op")
		b.ReportMetric(float64(deciding)/float64(hashing), "decide/hash")
		b.ReportMetric(float64(whole)/float64(hashing), "decision/hash")
		b.ReportMetric(float64(dry)/float64(hashing), "dry/hash")
	})
}
