package routing

import (
	"sync/atomic"

	"github.com/prefixmesh/prefixmesh/local"
)

// DecisionTotals sum what the committed decisions (CommitRecord and CommitBegin, every door)
// expected to reuse, for the question an operator asks first: is routing by cache helping? The
// chosen node's estimate against the candidates' mean is the gain over a choice that ignores the
// cache (round-robin or a random pick expects the mean), measured on the same requests.
type DecisionTotals struct {
	Requests     uint64
	PromptTokens uint64
	// MatchedTokens are the estimated reused tokens on the chosen nodes, as the engine will
	// report them (Choice.MatchedTokens).
	MatchedTokens uint64
	// UniformMatchedTokens are, summed over the decisions, the mean estimate over each
	// decision's candidates: what a uniformly random choice among them would reuse.
	UniformMatchedTokens float64
	// TierTokens split the chosen nodes' estimates by tier (Choice.Tiers): the GPU prefixes and
	// what lower tiers added to them, before the engine's last-token rule.
	TierTokens [local.NumTiers]uint64
}

// decisionTotals are DecisionTotals as atomics: Decide adds outside the decider's lock.
type decisionTotals struct {
	requests, prompt, matched atomic.Uint64
	// uniformMilli is UniformMatchedTokens in thousandths of a token, so that a fractional mean
	// adds atomically; 2^64 thousandths is ~1.8e16 tokens, years of a large fleet's prompts.
	uniformMilli atomic.Uint64
	tiers        [local.NumTiers]atomic.Uint64
}

// add counts one committed decision: prompt tokens, the chosen node's estimate and its tiers, and
// the candidates' raw matched tokens with what their lower tiers add (one block size each, so the
// mean uses the engine's rule too).
func (t *decisionTotals) add(prompt, chosen int, tiers *TierTokens, matched []int, lower []TierTokens, nodes []NodeInfo) {
	for i, n := range tiers {
		if n > 0 {
			t.tiers[i].Add(uint64(n))
		}
	}
	var sum int
	for i, m := range matched {
		sum += local.EngineCachedTokens(m+lower[i].Lower(), prompt, blockSizeOf(&nodes[i]))
	}
	t.requests.Add(1)
	t.prompt.Add(uint64(prompt))
	t.matched.Add(uint64(chosen))
	if len(matched) > 0 {
		t.uniformMilli.Add(uint64(sum) * 1000 / uint64(len(matched)))
	}
}

// Totals returns the sums over every decision this decider committed.
func (d *Decider) Totals() DecisionTotals {
	t := DecisionTotals{
		Requests:             d.totals.requests.Load(),
		PromptTokens:         d.totals.prompt.Load(),
		MatchedTokens:        d.totals.matched.Load(),
		UniformMatchedTokens: float64(d.totals.uniformMilli.Load()) / 1000,
	}
	for i := range t.TierTokens {
		t.TierTokens[i] = d.totals.tiers[i].Load()
	}
	return t
}
