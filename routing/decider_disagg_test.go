package routing

import (
	"testing"
	"time"
)

// A decode node with 4 s of prefill queued and an idle prefill node: the request's prefill goes to
// the prefill node (PlanPrefill's arithmetic, tested on its own), the prefill leg is counted in
// flight there with its prompt's prefill work, and the decode leg stops counting prefill work.
// When both legs end, nothing is left in flight.
func TestDeciderPlanPrefill(t *testing.T) {
	idx := NewIndex(DefaultIndexConfig())
	idx.ReplaceNode("d", 1, 1, nil)
	idx.ReplaceNode("p", 1, 1, nil)
	pol, _ := NewPolicy(PolicyPrefixMesh, DefaultPolicyConfig())
	d, err := NewDecider(idx, NewOverlay(0, 0), pol, DeciderConfig{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(100, 0)
	req := &DecideRequest{Tokens: seqTokens(8192, 1)}
	decode := []NodeInfo{{ID: "d", Alive: true, QueuedPrefillTokens: 40000}}
	var c Choice
	if err := d.Decide(req, decode, now, CommitBegin, &c); err != nil {
		t.Fatal(err)
	}
	if got := d.OwnInFlight("d").PrefillTokens; got != 8192 {
		t.Fatalf("decode leg's prefill in flight %d before planning", got)
	}
	prefill := []NodeInfo{{ID: "p", Alive: true}}
	pf := d.PlanPrefill(req, &decode[c.Node], &c, prefill, DisaggAuto, now, CommitBegin)
	if pf.Node != 0 || pf.Ticket == nil || pf.Plan.Reason != PrefillRemoteFaster {
		t.Fatalf("plan %+v: want the idle prefill node", pf)
	}
	if got := d.OwnInFlight("p"); got.Requests != 1 || got.PrefillTokens != 8192 {
		t.Fatalf("prefill node in flight %+v, want 1 request and 8192 prefill tokens", got)
	}
	if got := d.OwnInFlight("d"); got.Requests != 1 || got.PrefillTokens != 0 {
		t.Fatalf("decode node in flight %+v, want 1 request and no prefill work", got)
	}
	pf.Ticket.FirstToken(now.Add(time.Second))
	pf.Ticket.Done(now.Add(time.Second), true)
	c.Ticket.FirstToken(now.Add(2 * time.Second))
	c.Ticket.Done(now.Add(3*time.Second), true)
	if got := d.OwnInFlight("p"); got != (InFlight{}) {
		t.Fatalf("prefill node left %+v", got)
	}
	if got := d.OwnInFlight("d"); got != (InFlight{}) {
		t.Fatalf("decode node left %+v", got)
	}
	// The prefill node's own answer taught its fit; the decode leg taught nothing.
	if d.LearnedTTFT("p").Samples == 0 {
		t.Fatal("the prefill leg's first token taught nothing")
	}
	if l := d.learned["d"]; l != nil && l.n > 0 {
		t.Fatal("the decode leg's first byte was learned as its TTFT")
	}
	// Never: local, nothing begun.
	var c2 Choice
	if err := d.Decide(req, decode, now, CommitBegin, &c2); err != nil {
		t.Fatal(err)
	}
	if pf := d.PlanPrefill(req, &decode[c2.Node], &c2, prefill, DisaggNever, now, CommitBegin); pf.Node != -1 || pf.Ticket != nil {
		t.Fatalf("never: %+v", pf)
	}
	c2.Ticket.Done(now, true)
	// The transfer learner is reachable.
	d.ObserveTransfer(&PrefillPlan{Transfer: 1000, DecodeWait: 0.005}, 0.015)
	if d.TransferFit().Samples == 0 {
		t.Fatal("transfer not learned")
	}
}
