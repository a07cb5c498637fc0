package routing

import (
	"errors"
	"testing"
	"time"

	"github.com/prefixmesh/prefixmesh/local"
)

func testDecider(t *testing.T, cfg DeciderConfig) (*Decider, *Index) {
	t.Helper()
	idx := NewIndex(DefaultIndexConfig())
	for _, id := range []string{"a", "b", "c"} {
		idx.ReplaceNode(id, 1, 1, nil)
	}
	p, err := NewPolicy(PolicyPrefixMesh, DefaultPolicyConfig())
	if err != nil {
		t.Fatal(err)
	}
	d, err := NewDecider(idx, NewOverlay(0, 0), p, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return d, idx
}

func candidates() []NodeInfo {
	return []NodeInfo{{ID: "a", Alive: true}, {ID: "b", Alive: true}, {ID: "c", Alive: true}}
}

func seqTokens(n int, base uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = base + uint32(i)
	}
	return out
}

// A committed request counts in flight until Done, holds only the part of its chain beyond the
// node's summary in the overlay until its first token, and the next request on the same prefix
// follows it; the hook hears the decision with the summary's offset.
func TestDeciderBeginFirstTokenDone(t *testing.T) {
	var heard []int
	d, idx := testDecider(t, DeciderConfig{Hooks: DeciderHooks{OnDecision: func(node string, hashes []uint64, indexed int, _ time.Time) {
		heard = append(heard, indexed, len(hashes))
	}}})
	toks := seqTokens(160, 1) // 10 blocks
	idx.ReplaceNode("b", 1, 2, local.BlockHashes(toks[:64], 16, 0))
	now := time.Unix(100, 0)
	var c Choice
	if err := d.Decide(&DecideRequest{Tokens: toks}, candidates(), now, CommitBegin, &c); err != nil {
		t.Fatal(err)
	}
	if c.Candidates[c.Node].MatchedTokens != 64 || len(heard) != 2 || heard[0] != 4 || heard[1] != 10 {
		t.Fatalf("choice %+v, hook heard %v", c, heard)
	}
	node := candidates()[c.Node].ID
	if l := d.OwnInFlight(node); l != (InFlight{Requests: 1, Tokens: 160, PrefillTokens: 96}) {
		t.Fatalf("in flight %+v", l)
	}
	if st := d.Overlay().Stats(); st.Pending != 6 {
		t.Fatalf("overlay holds %d pending pairs, want the 6 blocks beyond the summary", st.Pending)
	}
	var c2 Choice
	// The whole prompt is now expected on the node; the engine will report 144 of its 160
	// tokens (local.EngineCachedTokens: a fully cached prompt recomputes its last block).
	if err := d.Decide(&DecideRequest{Tokens: toks}, candidates(), now, CommitNone, &c2); err != nil || c2.Node != c.Node || c2.MatchedTokens != 144 {
		t.Fatalf("a second request: %+v %v", c2, err)
	}
	c.Ticket.FirstToken(now)
	if l := d.OwnInFlight(node); l != (InFlight{Requests: 1, Tokens: 160}) {
		t.Fatalf("after first token %+v", l)
	}
	c.Ticket.Done(now, true)
	c.Ticket.Done(now, true)
	if l := d.OwnInFlight(node); l != (InFlight{}) {
		t.Fatalf("after Done %+v", l)
	}
	if st := d.Overlay().Stats(); st.Pending != 0 || st.Pairs != 6 {
		t.Fatalf("overlay after Done %+v: want the 6 pairs recorded with the TTL", st)
	}
}

// Peers' loads count in every candidate's in-flight fields until they expire or the peer is
// forgotten; a report in fewer parts drops the parts beyond; the cap applies to the total.
func TestDeciderPeersAndCap(t *testing.T) {
	d, _ := testDecider(t, DeciderConfig{MaxInFlightPerNode: 2, PeerLoadTTL: time.Second})
	now := time.Unix(100, 0)
	d.SetPeerLoad("r1", 0, 2, []NodeInFlight{{Node: "a", InFlight: InFlight{Requests: 2, Tokens: 10}}}, now)
	d.SetPeerLoad("r1", 1, 2, []NodeInFlight{{Node: "b", InFlight: InFlight{Requests: 2, Tokens: 20}}}, now)
	d.SetPeerLoad("r2", 0, 1, []NodeInFlight{{Node: "b", InFlight: InFlight{Requests: 1}}}, now)
	if d.Peers() != 2 || d.TotalInFlight("b", now) != (InFlight{Requests: 3, Tokens: 20}) {
		t.Fatalf("peers %d, b %+v", d.Peers(), d.TotalInFlight("b", now))
	}
	var c Choice
	if err := d.Decide(&DecideRequest{Tokens: seqTokens(32, 5)}, candidates(), now, CommitNone, &c); err != nil || candidates()[c.Node].ID != "c" {
		t.Fatalf("with a and b at the cap: %+v %v", c, err)
	}
	d.SetPeerLoad("r1", 0, 1, nil, now.Add(time.Millisecond)) // r1 now reports one part: b's is gone
	if l := d.TotalInFlight("b", now); l != (InFlight{Requests: 1}) {
		t.Fatalf("after r1 shrank: b %+v", l)
	}
	d.SetPeerLoad("r1", 0, 1, []NodeInFlight{{Node: "c", InFlight: InFlight{Requests: 5}}}, now.Add(2*time.Millisecond))
	d.SetPeerLoad("r2", 0, 1, []NodeInFlight{{Node: "a", InFlight: InFlight{Requests: 5}}, {Node: "b", InFlight: InFlight{Requests: 5}}}, now.Add(2*time.Millisecond))
	if err := d.Decide(&DecideRequest{Tokens: seqTokens(32, 5)}, candidates(), now, CommitNone, &c); !errors.Is(err, ErrOverloaded) {
		t.Fatalf("every node at the cap: %v", err)
	}
	d.ForgetPeer("r2")
	if l := d.TotalInFlight("a", now); l != (InFlight{}) {
		t.Fatalf("after forgetting r2: a %+v", l)
	}
	if l := d.TotalInFlight("c", now.Add(3*time.Second)); l != (InFlight{}) || d.Peers() != 0 {
		t.Fatalf("after the TTL: c %+v, %d peers", l, d.Peers())
	}
	if d.SetPeerLoad("r3", 2, 2, nil, now) || d.SetPeerLoad("r3", 0, MaxLoadParts+1, nil, now) {
		t.Fatal("accepted a part out of range")
	}
}

// RefreshPending reports queued requests again once their last report is old enough, and stops
// at their first token.
func TestDeciderRefreshPending(t *testing.T) {
	n := 0
	d, _ := testDecider(t, DeciderConfig{Hooks: DeciderHooks{OnDecision: func(string, []uint64, int, time.Time) { n++ }}})
	now := time.Unix(100, 0)
	var c Choice
	if err := d.Decide(&DecideRequest{Tokens: seqTokens(64, 9)}, candidates(), now, CommitBegin, &c); err != nil || n != 1 {
		t.Fatal(err, n)
	}
	d.RefreshPending(now.Add(time.Second), 1500*time.Millisecond)
	d.RefreshPending(now.Add(2*time.Second), 1500*time.Millisecond)
	if n != 2 {
		t.Fatalf("%d reports, want 2", n)
	}
	c.Ticket.FirstToken(now.Add(3 * time.Second))
	d.RefreshPending(now.Add(9*time.Second), time.Millisecond)
	if n != 2 {
		t.Fatalf("%d reports after the first token", n)
	}
	c.Ticket.Done(now.Add(9*time.Second), true)
}

func TestSessionKey(t *testing.T) {
	if SessionKey("") != 0 || SessionKey("a") == 0 || SessionKey("a") != SessionKey("a") || SessionKey("a") == SessionKey("b") {
		t.Fatal("SessionKey")
	}
	// Fixed vectors: the key must not change between releases (replicas of two versions agree).
	if got := SessionKey("conversation-1"); got != 0x759df6e77ec5d277 {
		t.Fatalf("SessionKey = %#x", got)
	}
}

// A cold node's summary is partial: the decision counts its matched tokens as 0 (index and
// overlay), so affinity goes to the warm node holding the same prefix; alone, the cold node still
// takes the request. Flagged warm again, it gets its affinity back.
func TestDeciderColdNodeHasNoAffinity(t *testing.T) {
	d, idx := testDecider(t, DeciderConfig{})
	toks := seqTokens(160, 1) // 10 blocks
	idx.ReplaceNode("a", 1, 2, local.BlockHashes(toks, 16, 0))
	idx.ReplaceNode("b", 1, 2, local.BlockHashes(toks[:64], 16, 0))
	now := time.Unix(100, 0)
	nodes := candidates()
	nodes[0].Cold = true
	var c Choice
	if err := d.Decide(&DecideRequest{Tokens: toks}, nodes, now, CommitNone, &c); err != nil {
		t.Fatal(err)
	}
	if nodes[c.Node].ID != "b" || c.MatchedTokens != 64 {
		t.Fatalf("chose %s with %d matched tokens; want b (64) over the cold a", nodes[c.Node].ID, c.MatchedTokens)
	}
	for _, cd := range c.Candidates {
		if nodes[cd.Node].ID == "a" && cd.MatchedTokens != 0 {
			t.Fatalf("cold node a estimated at %d tokens, want 0", cd.MatchedTokens)
		}
	}
	// Routed to the cold node, the overlay holds the prefix there; still no affinity from it.
	alone := []NodeInfo{{ID: "a", Alive: true, Cold: true}}
	if err := d.Decide(&DecideRequest{Tokens: toks}, alone, now, CommitRecord, &c); err != nil || c.Node != 0 || c.MatchedTokens != 0 {
		t.Fatalf("the cold node alone: %+v %v; want it chosen with 0 matched tokens", c, err)
	}
	if err := d.Decide(&DecideRequest{Tokens: toks}, alone, now, CommitNone, &c); err != nil || c.MatchedTokens != 0 {
		t.Fatalf("cold after its overlay record: %+v %v; want 0 matched tokens", c, err)
	}
	nodes[0].Cold = false
	if err := d.Decide(&DecideRequest{Tokens: toks}, nodes, now, CommitNone, &c); err != nil || nodes[c.Node].ID != "a" || c.MatchedTokens != 144 {
		t.Fatalf("warm again: chose %s with %d matched tokens, %v; want a with 144 (vLLM's rule: the last block is recomputed)", nodes[c.Node].ID, c.MatchedTokens, err)
	}
}
