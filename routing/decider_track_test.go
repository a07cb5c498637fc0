package routing

import (
	"testing"
	"time"

	"github.com/prefixmesh/prefixmesh/local"
)

// A request moved to another node (a gateway's fallback) counts there as a decision for it
// would: in flight until Done, its uncached tokens as prefill until the first token, the part of
// its chain beyond the node's summary held in the overlay (so the next request on the prefix
// follows it), and the hook hears it; the node it left keeps nothing once its ticket is given
// back as failed.
func TestDeciderTrackFallback(t *testing.T) {
	var heard []int
	d, idx := testDecider(t, DeciderConfig{Hooks: DeciderHooks{OnDecision: func(node string, hashes []uint64, indexed int, _ time.Time) {
		heard = append(heard, indexed, len(hashes))
	}}})
	toks := seqTokens(160, 1) // 10 blocks of 16
	hashes := local.BlockHashes(toks, 16, 0)
	idx.ReplaceNode("a", 1, 2, hashes[:6]) // the decision's choice: 96 tokens cached
	idx.ReplaceNode("c", 1, 2, hashes[:3]) // where the gateway falls back: 48 cached
	now := time.Unix(100, 0)
	var c Choice
	if err := d.Decide(&DecideRequest{Tokens: toks}, candidates(), now, CommitBegin, &c); err != nil {
		t.Fatal(err)
	}
	if got := candidates()[c.Node].ID; got != "a" {
		t.Fatalf("chose %s, want a (the longest prefix)", got)
	}
	heard = heard[:0]
	c.Ticket.Done(now, false) // the gateway could not reach a
	served := &NodeInfo{ID: "c", Alive: true}
	tk := d.Track(served, hashes, len(toks), now)
	if tk.Node() != "c" {
		t.Fatalf("ticket on %s", tk.Node())
	}
	if l := d.OwnInFlight("a"); l != (InFlight{}) {
		t.Fatalf("the chosen node still holds %+v", l)
	}
	if l := d.OwnInFlight("c"); l != (InFlight{Requests: 1, Tokens: 160, PrefillTokens: 160 - 48}) {
		t.Fatalf("the served node holds %+v", l)
	}
	if len(heard) != 2 || heard[0] != 3 || heard[1] != 10 {
		t.Fatalf("hook heard %v, want indexed 3 of 10 hashes", heard)
	}
	if st := d.Overlay().Stats(); st.Pending != 7 {
		t.Fatalf("overlay holds %d pending pairs, want the 7 blocks beyond c's summary", st.Pending)
	}
	// The whole prompt is now expected on c (less the last token, vLLM's rule), more than a's 96.
	var c2 Choice
	if err := d.Decide(&DecideRequest{Tokens: toks}, candidates(), now, CommitNone, &c2); err != nil || candidates()[c2.Node].ID != "c" || c2.MatchedTokens != 144 {
		t.Fatalf("the next request: %+v %v", c2, err)
	}
	tk.FirstToken(now)
	if l := d.OwnInFlight("c"); l != (InFlight{Requests: 1, Tokens: 160}) {
		t.Fatalf("after the first token %+v", l)
	}
	tk.Done(now, true)
	if l := d.OwnInFlight("c"); l != (InFlight{}) {
		t.Fatalf("after Done %+v", l)
	}
	if st := d.Overlay().Stats(); st.Pending != 0 || st.Pairs != 7 {
		t.Fatalf("overlay %+v, want the 7 blocks recorded and nothing pending", st)
	}
}

// Without hashes at the node's block size, or on a cold node (whose summary may over-estimate),
// the whole prompt counts as prefill.
func TestDeciderTrackWithoutAffinity(t *testing.T) {
	d, idx := testDecider(t, DeciderConfig{})
	toks := seqTokens(64, 1)
	hashes := local.BlockHashes(toks, 16, 0)
	idx.ReplaceNode("b", 1, 2, hashes)
	now := time.Unix(100, 0)
	for _, c := range []struct {
		name   string
		n      NodeInfo
		hashes []uint64
	}{
		{"no hashes", NodeInfo{ID: "b", Alive: true}, nil},
		{"cold", NodeInfo{ID: "b", Alive: true, Cold: true}, hashes},
	} {
		tk := d.Track(&c.n, c.hashes, len(toks), now)
		if l := d.OwnInFlight("b"); l != (InFlight{Requests: 1, Tokens: 64, PrefillTokens: 64}) {
			t.Fatalf("%s: %+v", c.name, l)
		}
		tk.Done(now, false)
		if l := d.OwnInFlight("b"); l != (InFlight{}) {
			t.Fatalf("%s: after Done %+v", c.name, l)
		}
	}
	if st := d.Overlay().Stats(); st.Pending != 0 || st.Pairs != 0 {
		t.Fatalf("overlay %+v, want nothing", st)
	}
}
