package routing

import (
	"fmt"
	"testing"
	"time"

	"github.com/prefixmesh/prefixmesh/internal/testenv"
	"github.com/prefixmesh/prefixmesh/local"
)

// peerPullDecider is a decider over nodes a, b (empty) and h (holding the whole 8,192-token
// prompt), with cfg and the in-flight cap maxPer.
func peerPullDecider(t *testing.T, cfg PolicyConfig, maxPer int, prompt []uint32) *Decider {
	t.Helper()
	idx := NewIndex(DefaultIndexConfig())
	idx.ReplaceNode("a", 1, 1, nil)
	idx.ReplaceNode("b", 1, 1, nil)
	idx.ReplaceNode("h", 1, 1, local.BlockHashes(prompt, 16, 0))
	pol, err := NewPolicy(PolicyPrefixMesh, cfg)
	if err != nil {
		t.Fatal(err)
	}
	d, err := NewDecider(idx, NewOverlay(0, 0), pol, DeciderConfig{MaxInFlightPerNode: maxPer})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// The holder queues 20 s of prefill, so prefixmesh sends the request to an idle empty node
// (cost 0.8192 s × (1 + 10) against 20 s); the pull from h is planned with PlanPeerPull's
// arithmetic (tested on its own): 8,176 tokens, C then holding them. The committed request counts
// only its last 16 tokens as prefill work in flight, and its first token teaches C nothing.
func TestDeciderPlanPeerPull(t *testing.T) {
	prompt := seqTokens(8192, 1)
	d := peerPullDecider(t, DefaultPolicyConfig(), 0, prompt)
	nodes := []NodeInfo{{ID: "a", Alive: true}, {ID: "b", Alive: true}, {ID: "h", Alive: true, QueuedPrefillTokens: 200000}}
	now := time.Unix(100, 0)
	req := &DecideRequest{Tokens: prompt}
	var c Choice
	if err := d.Decide(req, nodes, now, CommitBegin, &c); err != nil {
		t.Fatal(err)
	}
	if c.Node == 2 {
		t.Fatal("the overloaded holder was chosen")
	}
	id := nodes[c.Node].ID
	if got := d.OwnInFlight(id).PrefillTokens; got != 8192 {
		t.Fatalf("prefill in flight %d before planning, want 8192", got)
	}
	pp := d.PlanPeerPull(req, nodes, &c)
	if pp.Source != 2 || pp.Tokens != 8176 || pp.MatchedTokens != 8176 || pp.Reason != PeerPullPullFaster {
		t.Fatalf("plan %+v: want 8176 tokens from h", pp)
	}
	if got := d.OwnInFlight(id); got != (InFlight{Requests: 1, Tokens: 8192, PrefillTokens: 16}) {
		t.Fatalf("in flight after the pull %+v, want 1 request, 8192 tokens, 16 of prefill", got)
	}
	c.Ticket.FirstToken(now.Add(time.Second))
	c.Ticket.Done(now.Add(2*time.Second), true)
	if got := d.OwnInFlight(id); got != (InFlight{}) {
		t.Fatalf("left in flight %+v", got)
	}
	if l := d.learned[id]; l != nil && l.n > 0 {
		t.Fatal("a pulled request's first token was learned as its node's TTFT")
	}
	// The node now holds the prompt (the overlay, until its summary says so): the same prompt
	// follows it there and pulls nothing.
	var again Choice
	if err := d.Decide(req, nodes, now.Add(2*time.Second), CommitNone, &again); err != nil {
		t.Fatal(err)
	}
	if pp := d.PlanPeerPull(req, nodes, &again); again.Node != c.Node || pp.Source != -1 || pp.Reason != PeerPullNoHolder {
		t.Fatalf("the same prompt again: node %d, %+v; want node %d and no pull", again.Node, pp, c.Node)
	}
	// A recorded decision (gRPC Route) has no ticket: the plan only.
	d = peerPullDecider(t, DefaultPolicyConfig(), 0, prompt)
	var r Choice
	if err := d.Decide(req, nodes, now, CommitRecord, &r); err != nil {
		t.Fatal(err)
	}
	if pp := d.PlanPeerPull(req, nodes, &r); pp.Source != 2 || pp.Tokens != 8176 {
		t.Fatalf("recorded: %+v", pp)
	}
	if got := d.OwnInFlight(nodes[r.Node].ID); got != (InFlight{}) {
		t.Fatalf("a recorded decision counted %+v in flight", got)
	}
}

// With PeerPull off the same decision pulls nothing and leaves the ticket's work as it was.
func TestDeciderPlanPeerPullDisabled(t *testing.T) {
	prompt := seqTokens(8192, 1)
	cfg := DefaultPolicyConfig()
	cfg.PeerPull = false
	d := peerPullDecider(t, cfg, 0, prompt)
	nodes := []NodeInfo{{ID: "a", Alive: true}, {ID: "b", Alive: true}, {ID: "h", Alive: true, QueuedPrefillTokens: 200000}}
	req := &DecideRequest{Tokens: prompt}
	var c Choice
	if err := d.Decide(req, nodes, time.Unix(100, 0), CommitBegin, &c); err != nil {
		t.Fatal(err)
	}
	if pp := d.PlanPeerPull(req, nodes, &c); pp.Source != -1 || pp.Reason != PeerPullDisabled {
		t.Fatalf("disabled: %+v", pp)
	}
	if got := d.OwnInFlight(nodes[c.Node].ID).PrefillTokens; got != 8192 {
		t.Fatalf("prefill in flight %d, want 8192", got)
	}
	c.Ticket.Done(time.Unix(101, 0), true)
}

// A holder at the in-flight cap is no candidate for the request, but still a source: the first
// request goes to h (it holds the prompt), the second finds h at the cap of 1, goes to an empty
// node and pulls from h.
func TestDeciderPlanPeerPullHolderAtCap(t *testing.T) {
	prompt := seqTokens(8192, 1)
	d := peerPullDecider(t, DefaultPolicyConfig(), 1, prompt)
	nodes := []NodeInfo{{ID: "a", Alive: true}, {ID: "b", Alive: true}, {ID: "h", Alive: true}}
	now := time.Unix(100, 0)
	req := &DecideRequest{Tokens: prompt}
	var first, second Choice
	if err := d.Decide(req, nodes, now, CommitBegin, &first); err != nil || first.Node != 2 {
		t.Fatalf("first request: node %d, %v; want h", first.Node, err)
	}
	if pp := d.PlanPeerPull(req, nodes, &first); pp.Source != -1 || pp.Reason != PeerPullNoHolder {
		t.Fatalf("the holder itself: %+v", pp)
	}
	if err := d.Decide(req, nodes, now, CommitBegin, &second); err != nil || second.Node == 2 {
		t.Fatalf("second request: node %d, %v; want a or b", second.Node, err)
	}
	if pp := d.PlanPeerPull(req, nodes, &second); pp.Source != 2 || pp.Tokens != 8176 {
		t.Fatalf("second request: %+v, want 8176 tokens from h", pp)
	}
	first.Ticket.Done(now, true)
	second.Ticket.Done(now, true)
}

// TestAllocsPlanPeerPull backs the claim that planning a peer pull allocates nothing: 64 nodes,
// an 8,192-token prompt, every node holding a different-length prefix of it.
func TestAllocsPlanPeerPull(t *testing.T) {
	testenv.SkipAllocsUnderRace(t)
	prompt := seqTokens(8192, 1)
	hashes := local.BlockHashes(prompt, 16, 0)
	idx := NewIndex(DefaultIndexConfig())
	nodes := make([]NodeInfo, 64)
	for i := range nodes {
		id := fmt.Sprintf("node-%02d", i)
		idx.ReplaceNode(id, 1, 1, hashes[:i*len(hashes)/64])
		nodes[i] = NodeInfo{ID: id, Alive: true, QueuedPrefillTokens: i * 4000}
	}
	pol, _ := NewPolicy(PolicyPrefixMesh, DefaultPolicyConfig())
	d, err := NewDecider(idx, nil, pol, DeciderConfig{})
	if err != nil {
		t.Fatal(err)
	}
	req := &DecideRequest{Tokens: prompt}
	var c Choice
	if err := d.Decide(req, nodes, time.Unix(100, 0), CommitNone, &c); err != nil {
		t.Fatal(err)
	}
	var pp PeerPull
	if n := testing.AllocsPerRun(100, func() { pp = d.PlanPeerPull(req, nodes, &c) }); n != 0 {
		t.Errorf("PlanPeerPull allocated %.1f times per call, want 0", n)
	}
	if pp.Source != 63 || pp.Reason != PeerPullPullFaster {
		t.Errorf("plan %+v: want a pull from node-63, the longest holder", pp)
	}
}

// Pending prefixes are not runs to pull or to be pulled over: a sibling sent to the node a
// first request (still before its first token) went to pulls from the holder too, since that
// node has not computed the context yet; and a node only sent the context is no source.
func TestDeciderPlanPeerPullIgnoresPending(t *testing.T) {
	prompt := seqTokens(8192, 1)
	d := peerPullDecider(t, DefaultPolicyConfig(), 0, prompt)
	nodes := []NodeInfo{{ID: "a", Alive: true}, {ID: "b", Alive: true}, {ID: "h", Alive: true, QueuedPrefillTokens: 200000}}
	now := time.Unix(100, 0)
	req := &DecideRequest{Tokens: prompt}
	var first Choice
	if err := d.Decide(req, nodes, now, CommitBegin, &first); err != nil {
		t.Fatal(err)
	}
	if pp := d.PlanPeerPull(req, nodes, &first); pp.Source != 2 {
		t.Fatalf("first: %+v, want a pull from h", pp)
	}
	// The sibling: the first one's node looks like a holder to Decide (pending), not to the pull.
	var sib Choice
	if err := d.Decide(req, nodes, now.Add(time.Millisecond), CommitBegin, &sib); err != nil {
		t.Fatal(err)
	}
	pp := d.PlanPeerPull(req, nodes, &sib)
	if pp.Source != 2 || pp.Tokens != 8176 {
		t.Fatalf("sibling on %s: %+v, want 8176 tokens from h (the first one's node has computed nothing)", nodes[sib.Node].ID, pp)
	}
	// Without h's summary, the node only sent the context is no source.
	d2 := peerPullDecider(t, DefaultPolicyConfig(), 0, prompt)
	d2.index.ReplaceNode("h", 2, 1, nil)
	var c Choice
	if err := d2.Decide(req, nodes[:2], now, CommitBegin, &c); err != nil {
		t.Fatal(err)
	}
	var c2 Choice
	if err := d2.Decide(req, nodes[:2], now, CommitBegin, &c2); err != nil {
		t.Fatal(err)
	}
	if pp := d2.PlanPeerPull(req, nodes[:2], &c2); pp.Source != -1 {
		t.Fatalf("a pending run was named a source: %+v", pp)
	}
	for _, x := range []*Choice{&first, &sib, &c, &c2} {
		x.Ticket.Done(now, false)
	}
}
