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
	want := DecisionTotals{Requests: 1, PromptTokens: 160, MatchedTokens: 128, UniformMatchedTokens: 64}
	if got := d.Totals(); got != want {
		t.Fatalf("after one decision: %+v, want %+v", got, want)
	}
	c.Ticket.Done(now, true)
	// The first 64 tokens alone: b and c hold them whole, which the engine reports as 48.
	if err := d.Decide(&DecideRequest{Tokens: toks[:64]}, candidates(), now, CommitRecord, &c); err != nil {
		t.Fatal(err)
	}
	want = DecisionTotals{Requests: 2, PromptTokens: 224, MatchedTokens: 128 + 48, UniformMatchedTokens: 64 + 32}
	if got := d.Totals(); got != want {
		t.Fatalf("after two decisions: %+v, want %+v", got, want)
	}
}
