package routing

import (
	"testing"
	"time"

	"github.com/prefixmesh/prefixmesh/local"
)

// tierDecider is a decider over nodes "warm" and "cold", both idle, where "warm" holds the first
// blocks of tokens on tier (and nothing on its GPU), with the tier's configured load cost.
func tierDecider(t *testing.T, tier local.Tier, cost float64, tokens []uint32, blocks int) *Decider {
	t.Helper()
	cfg := DefaultPolicyConfig()
	cfg.TierLoadCost[tier] = cost
	p, err := NewPolicy(PolicyPrefixMesh, cfg)
	if err != nil {
		t.Fatal(err)
	}
	idx := NewIndex(DefaultIndexConfig())
	hashes := local.AppendBlockHashes(nil, tokens, 16, 0)
	var keys []uint64
	for _, h := range hashes[:blocks] {
		keys = append(keys, local.TierKey(h, tier))
	}
	idx.ReplaceNode("warm", 1, 1, keys)
	idx.ReplaceNode("cold", 1, 1, nil)
	d, err := NewDecider(idx, NewOverlay(0, 0), p, DeciderConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// withoutOverlay drops d's overlay, which would otherwise hold each request's prefix as if on
// the GPU, so a repeated prompt would match the GPU rather than the tier under test.
func withoutOverlay(d *Decider) *Decider {
	d.overlay = nil
	return d
}

func tierNodes() []NodeInfo {
	return []NodeInfo{{ID: "warm", Alive: true, BlockSize: 16}, {ID: "cold", Alive: true, BlockSize: 16}}
}

// A prompt whose prefix sits in one node's CPU tier goes there over an idle cold node, and the
// decision reports the tokens per tier and the total the engine will call cached (vLLM counts the
// connector's loaded tokens in num_cached_tokens): 16 full blocks of a 261-token prompt.
func TestDeciderCreditsCPUTier(t *testing.T) {
	tokens := seqTokens(16*16+5, 1)
	d := tierDecider(t, local.TierCPU, 1.0/15, tokens, 16)
	var c Choice
	if err := d.Decide(&DecideRequest{Tokens: tokens}, tierNodes(), time.Unix(100, 0), CommitNone, &c); err != nil {
		t.Fatal(err)
	}
	if c.Node != 0 {
		t.Fatalf("chose %d (%s), want the node with the CPU copy", c.Node, c.Reason)
	}
	if want := (TierTokens{local.TierCPU: 256}); c.Tiers != want || c.MatchedTokens != 256 {
		t.Fatalf("tiers %v matched %d, want %v and 256", c.Tiers, c.MatchedTokens, want)
	}
	if c.Candidates[1].MatchedTokens != 0 || c.Candidates[0].MatchedTokens != 256 {
		t.Fatalf("candidates %+v", c.Candidates)
	}
}

// A tier configured slower than recomputing is never preferred over a cold idle node, for any
// prompt (the tie-break hashes differ per prompt), while the same layout at a cost below 1 is
// preferred every time: the test can tell the two apart.
func TestDeciderSlowTierEarnsNothing(t *testing.T) {
	for _, tc := range []struct {
		cost     float64
		wantWarm bool
	}{{1.4, false}, {1.01, false}, {0.5, true}} {
		warm := 0
		for p := uint32(0); p < 200; p++ {
			tokens := seqTokens(8*16, 1000*p)
			d := tierDecider(t, local.TierDisk, tc.cost, tokens, 8)
			var c Choice
			if err := d.Decide(&DecideRequest{Tokens: tokens}, tierNodes(), time.Unix(100, 0), CommitNone, &c); err != nil {
				t.Fatal(err)
			}
			if c.Node == 0 {
				warm++
			}
		}
		if tc.wantWarm && warm != 200 || !tc.wantWarm && warm != 0 {
			t.Errorf("disk cost %v: the disk node won %d of 200 against an idle cold node", tc.cost, warm)
		}
	}
}

// The router learns a node's CPU load cost from first tokens: requests whose TTFT is the node's
// (prior) prefill time of the uncached part plus half the prefill time of the CPU part move the
// learned cost from the prior (1/15) to about 0.5, and GPU-only requests teach it nothing.
func TestDeciderLearnsTierCost(t *testing.T) {
	tokens := seqTokens(16*16, 1)
	d := withoutOverlay(tierDecider(t, local.TierCPU, 1.0/15, tokens, 8)) // half the prompt on the CPU
	now := time.Unix(100, 0)
	rate := DefaultPolicyConfig().DefaultPrefillTokensPerSec
	for i := 0; i < 400; i++ {
		var c Choice
		nodes := tierNodes()
		if err := d.Decide(&DecideRequest{Tokens: tokens}, nodes[:1], now, CommitBegin, &c); err != nil {
			t.Fatal(err)
		}
		ttft := (128 + 0.5*128) / rate // uncached 128 prefilled, 128 loaded at half the cost
		c.Ticket.learnForTest(d, now.Add(time.Duration(ttft*float64(time.Second))))
		c.Ticket.Done(now, true)
	}
	d.mu.Lock()
	got := d.tierLoadLocked("warm")
	d.mu.Unlock()
	if r := got[local.TierCPU]; r < 0.44 || r > 0.5 {
		t.Fatalf("learned CPU cost %v, want about 0.5 (shrunk toward 1/15 by the prior)", r)
	}
	if got[local.TierDisk] != 0 {
		t.Fatalf("disk cost learned from CPU hits: %v", got)
	}
}

// learnForTest teaches the tier learner t's first token at at, and nothing else: the node's fit
// stays the prior, so the test's arithmetic is exact.
func (t *Ticket) learnForTest(d *Decider, at time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.learnTierLocked(t, at.Sub(t.decided).Seconds())
}
