package requests

import (
	"errors"
	"fmt"
	"testing"

	"github.com/prefixmesh/prefixmesh/local"
	"github.com/prefixmesh/prefixmesh/routing"
)

func newTestPicker(t *testing.T, n int, cfg PolicyPickerConfig) (*PolicyPicker, *nodeList, *routing.Index) {
	t.Helper()
	list := &nodeList{}
	var targets []NodeTarget
	for i := range n {
		targets = append(targets, target(fmt.Sprintf("n%d", i), fmt.Sprintf("http://n%d", i)))
	}
	list.set(targets)
	idx := routing.NewIndex(routing.DefaultIndexConfig())
	pol, err := routing.NewPolicy(routing.PolicyPrefixMesh, routing.DefaultPolicyConfig())
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewPolicyPicker(list, idx, routing.NewOverlay(0, 0), pol, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p, list, idx
}

func seqTokens(n int, base uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = base + uint32(i)
	}
	return out
}

// The picker follows the index, counts its own in-flight load until Done (once), and the overlay
// keeps a burst on a new prefix together before any summary reports it.
func TestPolicyPicker(t *testing.T) {
	p, _, idx := newTestPicker(t, 4, PolicyPickerConfig{})
	toks := seqTokens(64, 1000)
	// n2 holds the first 3 blocks.
	idx.ReplaceNode("n2", 1, 1, local.BlockHashes(toks[:48], 16, 0))
	pk, err := p.Pick(t.Context(), &PickRequest{Tokens: toks, Model: simModel}, nil)
	if err != nil || pk.NodeID != "n2" || pk.EstimatedMatchedTokens != 48 || pk.EngineURL != "http://n2" || pk.Policy != "prefixmesh" {
		t.Fatalf("pick %+v %v", pk, err)
	}
	if p.InFlight("n2") != 1 {
		t.Fatalf("in-flight %d", p.InFlight("n2"))
	}
	pk.FirstToken()
	pk.Done(Outcome{Status: 200})
	pk.Done(Outcome{Status: 200})
	if l := p.Decider().OwnInFlight("n2"); l != (routing.InFlight{}) {
		t.Fatalf("in-flight after Done: %+v", l)
	}
	// Excluding n2 sends it elsewhere.
	pk2, err := p.Pick(t.Context(), &PickRequest{Tokens: toks, Model: simModel}, []string{"n2"})
	if err != nil || pk2.NodeID == "n2" || pk2.EstimatedMatchedTokens != 0 {
		t.Fatalf("pick excluding n2: %+v %v", pk2, err)
	}
	pk2.Done(Outcome{})

	// A new prefix: the first request's hashes go into the overlay, so the second follows it.
	fresh := seqTokens(80, 5000)
	a, err := p.Pick(t.Context(), &PickRequest{Tokens: fresh}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Done(Outcome{})
	b, err := p.Pick(t.Context(), &PickRequest{Tokens: fresh}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Done(Outcome{})
	// vLLM's cached_tokens rule: all 80 tokens are cached, and the engine recomputes the last block: 64.
	if b.NodeID != a.NodeID || b.EstimatedMatchedTokens != 64 {
		t.Fatalf("burst split: %s then %s (estimate %d)", a.NodeID, b.NodeID, b.EstimatedMatchedTokens)
	}

	// Unknown model, every node excluded: ErrNoNodes.
	if _, err := p.Pick(t.Context(), &PickRequest{Tokens: toks, Model: "other"}, nil); !errors.Is(err, ErrNoNodes) {
		t.Fatalf("unknown model: %v", err)
	}
	if _, err := p.Pick(t.Context(), &PickRequest{Tokens: toks}, []string{"n0", "n1", "n2", "n3"}); !errors.Is(err, ErrNoNodes) {
		t.Fatalf("all excluded: %v", err)
	}
	if got := p.Models(); len(got) != 1 || got[0] != simModel {
		t.Fatalf("models %v", got)
	}
}

// Session affinity: a conversation stays on one node while it is within the load bound.
func TestPolicyPickerSessionAffinity(t *testing.T) {
	p, _, _ := newTestPicker(t, 4, PolicyPickerConfig{})
	first := ""
	for i := range 8 {
		pk, err := p.Pick(t.Context(), &PickRequest{Tokens: seqTokens(40, uint32(100*i)), SessionKey: sessionKey("conv-1")}, nil)
		if err != nil {
			t.Fatal(err)
		}
		pk.Done(Outcome{})
		if first == "" {
			first = pk.NodeID
		}
		if pk.NodeID != first || pk.Reason != routing.ReasonSession {
			t.Fatalf("turn %d went to %s (%s), session is on %s", i, pk.NodeID, pk.Reason, first)
		}
	}
}
