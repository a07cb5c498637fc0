package routing

import (
	"testing"
	"time"

	"github.com/prefixmesh/prefixmesh/local"
)

// Totals count committed decisions only, with the chosen node's estimate and the candidates'
// mean, both by the engine's rule for a fully cached prompt (the last token is recomputed, so a
// 64-token prompt cached whole reports 48 at block size 16). The expected sums are worked out
// by hand from what each node holds.
func TestDecisionTotals(t *testing.T) {
	d, idx := testDecider(t, DeciderConfig{})
	toks := seqTokens(160, 1)                                        // 10 blocks of 16
	idx.ReplaceNode("b", 1, 2, local.BlockHashes(toks[:64], 16, 0))  // 4 blocks
	idx.ReplaceNode("c", 1, 2, local.BlockHashes(toks[:128], 16, 0)) // 8 blocks
	now := time.Unix(100, 0)
	var c Choice
	if err := d.Decide(&DecideRequest{Tokens: toks}, candidates(), now, CommitNone, &c); err != nil {
		t.Fatal(err)
	}
	if got := d.Totals(); got != (DecisionTotals{}) {
		t.Fatalf("a dry run counted: %+v", got)
	}
	if err := d.Decide(&DecideRequest{Tokens: toks}, candidates(), now, CommitBegin, &c); err != nil {
		t.Fatal(err)
	}
	if candidates()[c.Node].ID != "c" {
		t.Fatalf("idle nodes, chose %s over the one holding 128 tokens", candidates()[c.Node].ID)
	}
	// a: 0, b: 64, c: 128 → mean 64; chosen 128.
	want := DecisionTotals{Requests: 1, PromptTokens: 160, MatchedTokens: 128, UniformMatchedTokens: 64,
		TierTokens: [local.NumTiers]uint64{local.TierGPU: 128}}
	if got := d.Totals(); got != want {
		t.Fatalf("after one decision: %+v, want %+v", got, want)
	}
	c.Ticket.Done(now, true)
	// The first 64 tokens alone: b and c hold them whole, which the engine reports as 48.
	if err := d.Decide(&DecideRequest{Tokens: toks[:64]}, candidates(), now, CommitRecord, &c); err != nil {
		t.Fatal(err)
	}
	// The tiers count the raw match (64 on b or c's GPU), before the engine's last-token rule.
	want = DecisionTotals{Requests: 2, PromptTokens: 224, MatchedTokens: 128 + 48, UniformMatchedTokens: 64 + 32,
		TierTokens: [local.NumTiers]uint64{local.TierGPU: 128 + 64}}
	if got := d.Totals(); got != want {
		t.Fatalf("after two decisions: %+v, want %+v", got, want)
	}
	// A third prompt (three blocks and two tokens) whose blocks a holds on its CPU only (tier
	// keys): a is chosen, the CPU tier counts, and so does the uniform mean (48 / 3).
	other := seqTokens(48, 5000)
	var cpu []uint64
	for _, h := range local.BlockHashes(other, 16, 0) {
		cpu = append(cpu, local.TierKey(h, local.TierCPU))
	}
	idx.ReplaceNode("a", 1, 3, cpu)
	if err := d.Decide(&DecideRequest{Tokens: append(other, 1, 2)}, candidates(), now, CommitRecord, &c); err != nil {
		t.Fatal(err)
	}
	want = DecisionTotals{Requests: 3, PromptTokens: 274, MatchedTokens: 128 + 48 + 48, UniformMatchedTokens: 64 + 32 + 16,
		TierTokens: [local.NumTiers]uint64{local.TierGPU: 128 + 64, local.TierCPU: 48}}
	if got := d.Totals(); got != want {
		t.Fatalf("after three decisions: %+v, want %+v", got, want)
	}
}
