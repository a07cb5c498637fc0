package routing

import (
	"sync"
	"testing"
	"time"
)

// blockingPolicy lets a test hold one decision inside the decider's critical section.
type blockingPolicy struct {
	Policy
	enter chan struct{} // a Choose has started
	wait  chan struct{} // closed: Choose may return
	once  sync.Once
}

func (p *blockingPolicy) Choose(r *Request, nodes []NodeInfo, matched []int, now time.Time, d *Decision) error {
	first := false
	p.once.Do(func() { first = true })
	if first {
		close(p.enter)
		<-p.wait
	}
	return p.Policy.Choose(r, nodes, matched, now, d)
}

// A request that estimated while another request on the same new prefix was being decided sees
// that request's prefix once it gets the lock: two requests of a burst on one router land
// together. Before the fix the second kept its stale estimate (the first's Begin ran after the
// unlock, and nothing estimated again) and spread by load.
func TestDeciderBurstSeesItsOwnPrefixes(t *testing.T) {
	d, _ := testDecider(t, DeciderConfig{})
	inner := d.policy
	bp := &blockingPolicy{Policy: inner, enter: make(chan struct{}), wait: make(chan struct{})}
	d.policy = bp
	estimated := make(chan struct{})
	var estOnce sync.Once
	toks := seqTokens(320, 7) // 20 blocks nobody holds
	now := time.Unix(100, 0)
	var first Choice
	errs := make(chan error, 2)
	go func() { errs <- d.Decide(&DecideRequest{Tokens: toks}, candidates(), now, CommitBegin, &first) }()
	<-bp.enter // the first is inside Choose, holding mu
	// The second estimates now, before the first has committed, then waits on mu.
	d.afterEstimate = func() { estOnce.Do(func() { close(estimated) }) }
	var second Choice
	go func() { errs <- d.Decide(&DecideRequest{Tokens: toks}, candidates(), now, CommitBegin, &second) }()
	select {
	case <-estimated:
	case <-time.After(10 * time.Second):
		t.Fatal("the second decision never estimated")
	}
	close(bp.wait)
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if second.Node != first.Node || second.MatchedTokens == 0 {
		t.Fatalf("first to %d; second to %d with %d matched tokens: it did not see the first's prefix", first.Node, second.Node, second.MatchedTokens)
	}
	first.Ticket.Done(now, true)
	second.Ticket.Done(now, true)
}

// RefreshPending reports outside the decider's lock: a hook that takes time, or calls back into
// the decider (as a sharer reading loads might), does not stall decisions. Before the fix the
// hook ran under mu and this test deadlocked.
func TestRefreshPendingReportsOutsideTheLock(t *testing.T) {
	d, _ := testDecider(t, DeciderConfig{})
	now := time.Unix(100, 0)
	var c Choice
	if err := d.Decide(&DecideRequest{Tokens: seqTokens(64, 1)}, candidates(), now, CommitBegin, &c); err != nil {
		t.Fatal(err)
	}
	var heard []int
	d.SetHooks(DeciderHooks{OnDecision: func(node string, hashes []uint64, indexed int, _ time.Time) {
		var c2 Choice // a decision from inside the hook: needs mu
		if err := d.Decide(&DecideRequest{Tokens: seqTokens(64, 9000)}, candidates(), now, CommitNone, &c2); err != nil {
			t.Error(err)
		}
		heard = append(heard, len(hashes), indexed)
	}})
	done := make(chan struct{})
	go func() { d.RefreshPending(now.Add(2*time.Second), time.Second); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("RefreshPending held the decider's lock while calling the hook")
	}
	if len(heard) != 2 || heard[0] != 4 || heard[1] != 0 {
		t.Fatalf("heard %v, want one refresh of the 4 held blocks", heard)
	}
	c.Ticket.Done(now, true)
}

// A node that leaves (RemoveNode) or restarts (a summary of a new epoch) frees its overlay slot,
// so departed ids do not slow every estimate; a first token on a departed node records nothing.
func TestDeciderForgetsNodesTheIndexRemoves(t *testing.T) {
	d, idx := testDecider(t, DeciderConfig{})
	now := time.Unix(100, 0)
	for i, n := range []string{"a", "b", "c"} {
		d.Overlay().Record(n, []uint64{uint64(i + 1)}, now)
	}
	var c Choice
	if err := d.Decide(&DecideRequest{Tokens: seqTokens(64, 1)}, candidates()[:1], now, CommitBegin, &c); err != nil {
		t.Fatal(err)
	}
	slots := func() int {
		d.overlay.mu.RLock()
		defer d.overlay.mu.RUnlock()
		return len(d.overlay.slots.byID)
	}
	if slots() != 3 {
		t.Fatalf("%d slots", slots())
	}
	idx.RemoveNode("a") // left, with a request in flight
	if slots() != 2 {
		t.Fatalf("after a left: %d slots, want 2", slots())
	}
	c.Ticket.FirstToken(now)
	if slots() != 2 {
		t.Fatalf("a first token on a departed node took a slot again: %d", slots())
	}
	c.Ticket.Done(now, true)
	idx.ReplaceNode("b", 1, 5, nil) // same epoch: a repair, the overlay stays
	if slots() != 2 {
		t.Fatalf("after a repair: %d slots", slots())
	}
	idx.ReplaceNode("b", 2, 0, nil) // a restart
	if slots() != 1 || d.Overlay().Stats().Pairs != 1 {
		t.Fatalf("after b restarted: %d slots, %+v", slots(), d.Overlay().Stats())
	}
}

// Peers' decisions and loads are taken only for members: a node id the index does not hold
// takes no overlay slot and counts no load.
func TestDeciderValidatesPeerNodeIDs(t *testing.T) {
	d, _ := testDecider(t, DeciderConfig{})
	now := time.Unix(100, 0)
	if d.PeerDecision("r2", "forged", 0, []uint64{1, 2}, now) {
		t.Fatal("a decision for an unknown node was taken")
	}
	if d.PeerDecision("r2", "a", -1, []uint64{1}, now) || d.PeerDecision("r2", "a", MaxChainBlocks, []uint64{1}, now) {
		t.Fatal("a decision with an impossible offset was taken")
	}
	if !d.PeerDecision("r2", "a", 3, []uint64{1, 2}, now) {
		t.Fatal("a member's decision was refused")
	}
	if st := d.Overlay().Stats(); st.Pairs != 2 {
		t.Fatalf("overlay %+v", st)
	}
	d.overlay.mu.RLock()
	_, forged := d.overlay.slots.lookup("forged")
	d.overlay.mu.RUnlock()
	if forged {
		t.Fatal("the forged id took a slot")
	}
	if !d.SetPeerLoad("r2", 0, 1, []NodeInFlight{{Node: "a", InFlight: InFlight{Requests: 2}}, {Node: "ghost", InFlight: InFlight{Requests: 9}}}, now) {
		t.Fatal("load refused")
	}
	if l := d.TotalInFlight("ghost", now); l != (InFlight{}) {
		t.Fatalf("ghost counts %+v", l)
	}
	if l := d.TotalInFlight("a", now); l.Requests != 2 {
		t.Fatalf("a counts %+v", l)
	}
	if ids := d.PeerIDs(nil); len(ids) != 1 || ids[0] != "r2" {
		t.Fatalf("peers %v", ids)
	}
	d.ForgetPeer("r2")
	if l := d.TotalInFlight("a", now); l.Requests != 0 {
		t.Fatalf("after ForgetPeer a counts %+v", l)
	}
}
