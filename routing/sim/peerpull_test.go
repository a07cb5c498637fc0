package sim

import (
	"math"
	"testing"
	"time"

	"github.com/prefixmesh/prefixmesh/routing"
)

// Two nodes, least-loaded routing (it ignores caches, so the holder being busy is what sends the
// request elsewhere), no delays. R0 (2,048 tokens, blocks 1-4, 1,000 tokens to decode) takes
// node 0 and is still decoding there when R1 (the same 2,048 tokens and 512 more, 2 to decode)
// arrives at 1 s: least-loaded sends it to the idle node 1. The router plans the pull:
// without it node 1 prefills 2,560 tokens (its prior fit, 256 ms); with it 512 (51.2 ms) after
// the transfer prior's 5 ms + 2,048 × 5.2 µs. By hand (a step 18.4 ms + 0.1 ms a token, the
// transfer 10 ms + tokens / 100,000 per s):
//
//	node 1  1.000 – 1.03048  pulls the 2,048 tokens node 0 holds (10 + 20.48 ms)
//	        1.03048 – 1.10008  prefills the other 512 in one step (18.4 + 51.2 = 69.6 ms)
//	        then two decode steps of 18.5 ms
//
// TTFT 100.08 ms (274.4 ms, one step of 2,560 tokens, without the pull). The router observes
// one transfer of its planned 2,048 tokens in 30.48 ms, so its fit is (30.48 ms − the prior's
// 5 ms overhead) / 2,048 per token shrunk toward the prior with the weight of 16. Node 1 reports
// 2,048 cached, the router's estimate; its own cache held nothing, so the hit ratio is 0 and the
// pulled tokens are 2,048 of the 4,608 prompt tokens.
func TestPeerPullByHand(t *testing.T) {
	tr := readTrace(t, `{"timestamp": 0, "input_length": 2048, "output_length": 1000, "hash_ids": [1, 2, 3, 4]}
{"timestamp": 1000, "input_length": 2560, "output_length": 2, "hash_ids": [1, 2, 3, 4, 5]}
`)
	cfg := DefaultConfig()
	cfg.Nodes, cfg.Delay, cfg.LoadInterval = 2, 0, 0
	r, s := run(t, tr, routing.PolicyLeastLoaded, cfg)
	if len(r.TTFTs) != 2 || !near(r.TTFTs[0], 0.10008) {
		t.Fatalf("TTFTs %v, want R1's 100.08 ms first", r.TTFTs)
	}
	if r.PeerPullShare != 0.5 || r.PeerPullPlannedShare != 0.5 || r.PeerPullDelivered != 1 ||
		!near(r.PeerPullTokenShare, 2048./4608) || !near(r.PeerPullMeanMs, 30.48) || r.HitRatio != 0 {
		t.Fatalf("pulls %+v, hit ratio %v", r, r.HitRatio)
	}
	if r.PeerPullReasons[routing.PeerPullPullFaster] != 1 || r.PeerPullReasons[routing.PeerPullNoHolder] != 1 {
		t.Fatalf("reasons %v: want R0 no-longer-holder, R1 pull-faster", r.PeerPullReasons)
	}
	if r.EstimateExactShare != 1 {
		t.Fatalf("estimates exact %v, want 1 (R1: 2,048 estimated and reported)", r.EstimateExactShare)
	}
	prior := routing.DefaultTransfer.SecPerToken
	want := ((0.03048-0.005)/2048 + 16*prior) / 17
	if f := s.routers[0].dec.TransferFit(); f.Samples != 1 || math.Abs(f.SecPerToken-want) > 1e-15 {
		t.Fatalf("learned transfer %+v, want one sample of %v s/token", f, want)
	}
	// Node 1 computed 512 tokens and caches the whole prompt; nothing is left in flight.
	if s.nodes[1].prefillDone != 512 {
		t.Fatalf("node 1 prefilled %d tokens, want 512", s.nodes[1].prefillDone)
	}
	if got := s.nodes[1].tree.PeekMatchedTokens(tr.Requests[1].Tokens, cfg.BlockSize, 0); got != 2560 {
		t.Fatalf("node 1 caches %d tokens of R1, want 2560", got)
	}
	for _, n := range s.nodes {
		if len(n.pulls) != 0 || n.active != 0 {
			t.Fatalf("%s: %d pulls, %d blocks held after the run", n.id, len(n.pulls), n.active)
		}
	}

	// Off: node 1 prefills all 2,560 tokens in one step.
	cfg.Policy.PeerPull = false
	r, _ = run(t, tr, routing.PolicyLeastLoaded, cfg)
	if len(r.TTFTs) != 2 || !near(r.TTFTs[1], 0.2744) || r.PeerPullShare != 0 || r.PeerPullReasons[routing.PeerPullDisabled] != 2 {
		t.Fatalf("off: TTFTs %v, pulls %v %v: want R1 at 274.4 ms, none", r.TTFTs, r.PeerPullShare, r.PeerPullReasons)
	}
}

// The source serves what it holds when the pull runs, whatever the router planned: the full
// blocks past the puller's hit, up to the last block counted as cached.
func TestPeerPullServesWhatSourceHolds(t *testing.T) {
	tr := readTrace(t, `{"timestamp": 0, "input_length": 2048, "output_length": 1, "hash_ids": [1, 2, 3, 4]}
`)
	cfg := DefaultConfig()
	cfg.Nodes = 2
	s, err := New(tr, routing.PolicyPrefixMesh, cfg)
	if err != nil {
		t.Fatal(err)
	}
	toks := tr.Requests[0].Tokens
	hold := func(n int) { // the source caches the prompt's first n tokens
		seq, err := s.nodes[0].pool.Admit(toks[:n], 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := seq.Insert(); err != nil {
			t.Fatal(err)
		}
		if err := seq.Finish(); err != nil {
			t.Fatal(err)
		}
	}
	n := s.nodes[1]
	for _, c := range []struct {
		held, hit, want int
	}{
		{0, 0, 0},        // evicted (or never computed): nothing moves, the rest is recomputed
		{1000, 0, 992},   // a partial block is not served: 62 blocks
		{1000, 512, 480}, // past the puller's own 512
		{1000, 992, 0},   // nothing past the hit
		{2048, 0, 2032},  // the last block is recomputed (at most the prompt less one token cached)
	} {
		if c.held > 0 {
			hold(c.held)
		}
		n.pulls[0] = pullPlan{source: 0, tokens: 2048}
		got, d := n.pullPeer(s, 0, c.hit)
		wantD := time.Duration(0)
		if c.want > 0 {
			wantD = cfg.KVTransferOverhead + time.Duration(float64(c.want)/cfg.KVTransferTokensPerSec*float64(time.Second))
		}
		if got != c.want || d != wantD {
			t.Errorf("held %d, hit %d: pulled %d in %v, want %d in %v", c.held, c.hit, got, d, c.want, wantD)
		}
		if _, kept := n.pulls[0]; kept != (c.want > 0) {
			t.Errorf("held %d, hit %d: plan kept %v", c.held, c.hit, kept)
		}
	}
}
