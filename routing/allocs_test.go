package routing

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/prefixmesh/prefixmesh/internal/testenv"
	"github.com/prefixmesh/prefixmesh/local"
)

// TestAllocsEstimate backs the claim that an index estimate allocates nothing: a 512-block prompt
// against 16 nodes, each holding a different-length prefix of it plus blocks of its own.
func TestAllocsEstimate(t *testing.T) {
	testenv.SkipAllocsUnderRace(t)
	rng := rand.New(rand.NewPCG(1, 2))
	prompt := make([]uint64, 512)
	for i := range prompt {
		prompt[i] = rng.Uint64()
	}
	x := NewIndex(DefaultIndexConfig())
	var ids []string
	for n := range 16 {
		id := fmt.Sprintf("node-%02d", n)
		ids = append(ids, id)
		own := append([]uint64(nil), prompt[:n*len(prompt)/16]...)
		for range 1000 {
			own = append(own, rng.Uint64())
		}
		x.ReplaceNode(id, 1, 0, own)
	}
	got := make([]int, len(ids))
	if n := testing.AllocsPerRun(100, func() { x.Estimate(prompt, ids, got) }); n != 0 {
		t.Errorf("Estimate allocated %.1f times per call, want 0", n)
	}
	if got[15] != 15*len(prompt)/16 {
		t.Errorf("node-15 matched %d blocks, want %d", got[15], 15*len(prompt)/16)
	}
}

// TestAllocsChooseWithTiers backs the claim that a policy's choice allocates nothing when the
// request carries lower tiers too (the tier-aware baselines, dynamo-cost and llm-d, read them in
// Choose): 64 nodes, each with a CPU, disk or remote run after its GPU match.
func TestAllocsChooseWithTiers(t *testing.T) {
	testenv.SkipAllocsUnderRace(t)
	nodes := fleetInfo(64)
	matched := make([]int, 64)
	tiers := make([]TierTokens, 64)
	for i := range nodes {
		matched[i] = (i * 37) % 512
		tiers[i][local.TierCPU+local.Tier(i%4)] = 16 * (i % 9)
		nodes[i].InFlight, nodes[i].InFlightTokens, nodes[i].Waiting = i%5, (i%5)*700, i%3
		nodes[i].FreeBlocks = 1000 - 13*i
	}
	req := &Request{Hashes: chainOf(5, 64), PromptTokens: 1024, BlockSize: 16, Tiers: tiers}
	for _, name := range PolicyNames() {
		p := mustPolicy(t, name, DefaultPolicyConfig())
		var d Decision
		_ = p.Choose(req, nodes, matched, t0, &d)
		if n := testing.AllocsPerRun(50, func() { _ = p.Choose(req, nodes, matched, t0, &d) }); n != 0 {
			t.Errorf("%s: %v allocations per choice with tiers", name, n)
		}
	}
}
