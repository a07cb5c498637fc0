package sim

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/prefixmesh/prefixmesh/routing"
)

// One prefill node and one decode node, always disaggregating a 2,000-token prompt with 2 more
// tokens after the first. By hand (a step is 18.4 ms + 0.1 ms a token; the transfer 10 ms +
// tokens / 100,000 per s):
//
//	prefill node  0     – 218.4  the whole prompt in one step (18.4 + 200): the leg answers
//	decode node   218.4 – 248.4  pulls the 2,000 tokens it lacks (10 + 20)
//	              248.4 – 266.9  computes the last token (18.5): the first token
//	              266.9 – 303.9  two decode steps of 18.5
//
// TTFT 266.9 ms, ITL 18.5 ms; the router observes a transfer of 2,000 tokens in 48.5 ms (answer
// to first token), less the idle decode node's predicted wait left when the prefill answers (0.1
// ms for its one token, long over by then: none), so its fit is (48.5 ms − 5 ms) / 2,000 per
// token shrunk toward the prior with the weight of 16. Both nodes end with the prompt cached and nothing held.
func TestDisaggregatedByHand(t *testing.T) {
	tr := readTrace(t, `{"timestamp": 0, "input_length": 2000, "output_length": 2, "hash_ids": [1, 2, 3, 4]}
`)
	cfg := DefaultConfig()
	cfg.Nodes, cfg.PrefillNodes, cfg.Delay, cfg.Disaggregate = 2, 1, 0, DisaggAlways
	r, s := run(t, tr, routing.PolicyPrefixMesh, cfg)
	if len(r.TTFTs) != 1 || !near(r.TTFTs[0], 0.2669) {
		t.Fatalf("TTFTs %v, want 266.9 ms", r.TTFTs)
	}
	if !near(r.ITLMean, 0.0185) || !near(r.ITLP99, 0.0185) || !near(r.E2EMean, 0.3039) {
		t.Fatalf("ITL %v / %v, E2E %v: want 18.5, 18.5 and 303.9 ms", r.ITLMean, r.ITLP99, r.E2EMean)
	}
	if r.RemotePrefillShare != 1 || r.PrefillNodes != 1 || r.Disaggregate != "always" {
		t.Fatalf("remote share %v, prefill nodes %d, mode %q", r.RemotePrefillShare, r.PrefillNodes, r.Disaggregate)
	}
	prior := routing.DefaultTransfer.SecPerToken
	want := ((0.0485-0.005)/2000 + 16*prior) / 17
	if f := s.routers[0].dec.TransferFit(); f.Samples != 1 || math.Abs(f.SecPerToken-want) > 1e-15 {
		t.Fatalf("learned transfer %+v, want one sample of %v s/token", f, want)
	}
	for _, n := range s.nodes {
		if got := n.tree.PeekMatchedTokens(tr.Requests[0].Tokens, cfg.BlockSize, 0); got != 2000 {
			t.Fatalf("%s caches %d tokens of the prompt, want the whole prompt", n.id, got)
		}
		if st := n.pool.Stats(); st.Running != 0 || n.active != 0 || n.leased != 0 {
			t.Fatalf("%s: %d running, %d blocks held, %d leased", n.id, st.Running, n.active, n.leased)
		}
		if err := n.pool.Check(); err != nil {
			t.Fatal(err)
		}
	}
	// The prefill node computed the prompt; the decode node one token.
	if s.nodes[0].prefillDone != 2000 || s.nodes[1].prefillDone != 1 {
		t.Fatalf("prefilled %d and %d tokens, want 2000 and 1", s.nodes[0].prefillDone, s.nodes[1].prefillDone)
	}
}

// Each rule decides as its source says, on an idle fleet of one prefill and one decode node and
// requests far apart: R1 2,048 new tokens; R2 the same 2,048 and 100 more (the decode node holds
// the 2,048 after R1, whichever node prefilled it); R3 300 new tokens.
//
//	llm-d (remote iff ≥ 512 uncached on the decode node's GPU): R1 only.
//	Dynamo (local iff eff < 2048 and eff/prompt < 0.7): R1 (ratio 1) and R3 (ratio 1), not R2.
//	always (remote iff more than a block uncached): all three.
//	auto: none: the decode node is as idle as the prefill node, and a remote prefill adds the
//	transfer to the same work.
//	never: none.
func TestDisaggregationRules(t *testing.T) {
	tr := readTrace(t, `{"timestamp": 0, "input_length": 2048, "output_length": 1, "hash_ids": [1, 2, 3, 4]}
{"timestamp": 20000, "input_length": 2148, "output_length": 1, "hash_ids": [1, 2, 3, 4, 5]}
{"timestamp": 40000, "input_length": 300, "output_length": 1, "hash_ids": [9]}
`)
	for mode, want := range map[Disagg]float64{DisaggLLMD: 1. / 3, DisaggDynamo: 2. / 3, DisaggAlways: 1, DisaggAuto: 0, DisaggNever: 0} {
		cfg := DefaultConfig()
		cfg.Nodes, cfg.PrefillNodes, cfg.Delay, cfg.Disaggregate = 2, 1, 0, mode
		r, _ := run(t, tr, routing.PolicyPrefixMesh, cfg)
		if !near(r.RemotePrefillShare, want) || r.Served != 3 {
			t.Errorf("%s: remote share %v of %d served, want %v", mode, r.RemotePrefillShare, r.Served, want)
		}
	}
}

// A prefill node never decodes and a decode node never runs a prefill leg, on a busy trace with
// several routers; every request is served once and every node ends empty.
func TestDisaggregatedFleetRoles(t *testing.T) {
	tr := testTrace(t, 3, 300, 50*time.Millisecond)
	for _, mode := range DisaggModes() {
		cfg := smallConfig()
		cfg.PrefillNodes, cfg.Disaggregate, cfg.Routers = 1, mode, 2
		r, s := run(t, tr, routing.PolicyPrefixMesh, cfg)
		if r.Served != len(tr.Requests) {
			t.Fatalf("%s: served %d of %d", mode, r.Served, len(tr.Requests))
		}
		for _, n := range s.nodes {
			if len(n.running) != 0 || len(n.waiting) != 0 || n.leased != 0 || n.active != 0 {
				t.Fatalf("%s: %s not empty", mode, n.id)
			}
		}
		// Only the prefill node runs prefill legs: with none remote it computes nothing.
		if r.RemotePrefillShare == 0 && s.nodes[0].prefillDone != 0 {
			t.Fatalf("%s: the prefill node computed %d tokens with no remote prefill", mode, s.nodes[0].prefillDone)
		}
		if mode == DisaggAlways && r.RemotePrefillShare < 0.5 {
			t.Fatalf("always: only %.2f remote", r.RemotePrefillShare)
		}
	}
}

func TestDisaggConfigValidates(t *testing.T) {
	for _, c := range []func(*Config){
		func(c *Config) { c.PrefillNodes = c.Nodes },
		func(c *Config) { c.PrefillNodes = -1 },
		func(c *Config) { c.Disaggregate = "sometimes" },
		func(c *Config) { c.PrefillNodes, c.KVTransferTokensPerSec = 1, 0 },
		func(c *Config) { c.PrefillNodes, c.KVTransferOverhead = 1, -time.Millisecond },
		func(c *Config) { c.TokenBudget = -1 },
		func(c *Config) { c.LLMDNonCachedTokens = -1 },
	} {
		cfg := DefaultConfig()
		c(&cfg)
		if err := cfg.Validate(); !errors.Is(err, ErrConfig) {
			t.Errorf("%+v: %v, want ErrConfig", cfg, err)
		}
	}
}
