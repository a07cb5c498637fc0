package peershare

import (
	"math"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/prefixmesh/prefixmesh/cluster"
	"github.com/prefixmesh/prefixmesh/local"
	"github.com/prefixmesh/prefixmesh/routing"
)

// bus is an in-memory Transport between sharers: every packet reaches every other member,
// unless drop says otherwise (a hand-written fake of memberlist's best-effort send).
type bus struct {
	mu      sync.Mutex
	members []*member
}

type member struct {
	b *bus
	h func([]byte)
}

func (m *member) SetShareHandler(h func([]byte)) { m.h = h }

func (m *member) SendShare(p []byte) {
	m.b.mu.Lock()
	defer m.b.mu.Unlock()
	for _, o := range m.b.members {
		if o != m && o.h != nil {
			o.h(append([]byte(nil), p...))
		}
	}
}

func (b *bus) join() *member {
	m := &member{b: b}
	b.mu.Lock()
	b.members = append(b.members, m)
	b.mu.Unlock()
	return m
}

func newDecider(t *testing.T, idx *routing.Index) *routing.Decider {
	t.Helper()
	p, err := routing.NewPolicy(routing.PolicyPrefixMesh, routing.DefaultPolicyConfig())
	if err != nil {
		t.Fatal(err)
	}
	d, err := routing.NewDecider(idx, routing.NewOverlay(0, 0), p, routing.DeciderConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// startPair starts sharers "r0" and "r1" on the bus, each over its own decider on idx, and
// closes them when the test ends.
func startPair(t *testing.T, b *bus, idx *routing.Index) (d0, d1 *routing.Decider, s0, s1 *Sharer) {
	t.Helper()
	d0, d1 = newDecider(t, idx), newDecider(t, idx)
	var err error
	if s0, err = New(DefaultConfig("r0"), d0, b.join(), nil); err != nil {
		t.Fatal(err)
	}
	if s1, err = New(DefaultConfig("r1"), d1, b.join(), nil); err != nil {
		t.Fatal(err)
	}
	s0.Start(t.Context())
	s1.Start(t.Context())
	t.Cleanup(s0.Close)
	t.Cleanup(s1.Close)
	return d0, d1, s0, s1
}

func eventually(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// A decision and the in-flight load of one router reach the other: its overlay expects the new
// part of the prefix on the node (extending what the node's summary reports), and its view of
// the node's load includes the other router's request until it ends.
func TestSharerDecisionsAndLoad(t *testing.T) {
	var b bus
	idx := routing.NewIndex(routing.DefaultIndexConfig())
	toks := make([]uint32, 1600) // 100 blocks
	for i := range toks {
		toks[i] = uint32(i * 7)
	}
	hashes := local.BlockHashes(toks, 16, 0)
	for _, id := range []string{"a", "b", "c"} {
		idx.ReplaceNode(id, 1, 1, nil)
	}
	idx.ReplaceNode("b", 1, 1, hashes[:10]) // b already reports the first 10 blocks
	d0, d1, _, _ := startPair(t, &b, idx)

	nodes := []routing.NodeInfo{{ID: "a", Alive: true}, {ID: "b", Alive: true}, {ID: "c", Alive: true}}
	var c routing.Choice
	if err := d0.Decide(&routing.DecideRequest{Tokens: toks}, nodes, time.Now(), routing.CommitBegin, &c); err != nil {
		t.Fatal(err)
	}
	if nodes[c.Node].ID != "b" {
		t.Fatalf("chose %s, want b (it holds 10 blocks)", nodes[c.Node].ID)
	}
	est := func() int {
		blocks := []int{0}
		idx.Estimate(hashes, []string{"b"}, blocks)
		d1.Overlay().Estimate(hashes, []string{"b"}, blocks, time.Now())
		return blocks[0]
	}
	eventually(t, "r1 expects all 100 blocks on b", func() bool { return est() == 100 })
	eventually(t, "r1 counts r0's request on b", func() bool {
		return d1.TotalInFlight("b", time.Now()) == routing.InFlight{Requests: 1, Tokens: 1600, PrefillTokens: 1600 - 160}
	})
	c.Ticket.FirstToken(time.Now())
	c.Ticket.Done(time.Now(), true)
	eventually(t, "r1 sees r0's request end", func() bool { return d1.TotalInFlight("b", time.Now()) == routing.InFlight{} })
	// Each counts the other once its first load report (every Interval) has arrived: r1 may have
	// counted r0's request from the decision packet alone, before any report.
	eventually(t, "each router counts the other as a peer", func() bool { return d1.Peers() == 1 && d0.Peers() == 1 })
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig("r").Validate(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []Config{DefaultConfig(""), {RouterID: "r", Interval: 0, Heartbeat: time.Second, QueueSize: 1},
		{RouterID: "r", Interval: time.Second, Heartbeat: time.Millisecond, QueueSize: 1}, {RouterID: "r", Interval: 1, Heartbeat: 1}} {
		if c.Validate() == nil {
			t.Fatalf("accepted %+v", c)
		}
	}
}

// memberBus is a bus whose members also answer the membership (cluster.Agent's Members).
type memberBus struct {
	*member
	mu    sync.Mutex
	metas []cluster.Meta
}

func (m *memberBus) Members() []cluster.Meta {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]cluster.Meta(nil), m.metas...)
}

func (m *memberBus) set(metas ...cluster.Meta) {
	m.mu.Lock()
	m.metas = metas
	m.mu.Unlock()
}

// A router that leaves the membership stops counting at once (ForgetPeer), not only after the
// peer-load TTL: its requests on a node no longer inflate that node's load.
func TestSharerForgetsARouterThatLeft(t *testing.T) {
	var b bus
	idx := routing.NewIndex(routing.DefaultIndexConfig())
	idx.ReplaceNode("a", 1, 1, nil)
	d0, d1 := newDecider(t, idx), newDecider(t, idx)
	cfg0, cfg1 := DefaultConfig("r0"), DefaultConfig("r1")
	cfg0.Heartbeat, cfg1.Heartbeat = 20*time.Millisecond, 20*time.Millisecond
	s0, err := New(cfg0, d0, b.join(), nil)
	if err != nil {
		t.Fatal(err)
	}
	m1 := &memberBus{member: b.join()}
	m1.set(cluster.Meta{Role: cluster.RoleRouter, NodeID: "r0"}, cluster.Meta{Role: cluster.RoleRouter, NodeID: "r1"},
		cluster.Meta{Role: cluster.RoleNode, NodeID: "a"})
	s1, err := New(cfg1, d1, m1, nil)
	if err != nil {
		t.Fatal(err)
	}
	s0.Start(t.Context())
	s1.Start(t.Context())
	defer s0.Close()
	defer s1.Close()
	var c routing.Choice
	if err := d0.Decide(&routing.DecideRequest{Tokens: make([]uint32, 64)}, []routing.NodeInfo{{ID: "a", Alive: true}}, time.Now(), routing.CommitBegin, &c); err != nil {
		t.Fatal(err)
	}
	defer c.Ticket.Done(time.Now(), true)
	eventually(t, "r1 counts r0's request", func() bool { return d1.TotalInFlight("a", time.Now()).Requests == 1 })
	s0.Close() // r0 leaves: no more reports, and the membership no longer lists it
	m1.set(cluster.Meta{Role: cluster.RoleRouter, NodeID: "r1"}, cluster.Meta{Role: cluster.RoleNode, NodeID: "a"})
	eventually(t, "r1 forgets r0", func() bool { return d1.TotalInFlight("a", time.Now()).Requests == 0 && d1.Peers() == 0 })
}

// A decision naming a node that is not a member is dropped and takes nothing.
func TestSharerDropsDecisionsForUnknownNodes(t *testing.T) {
	var b bus
	idx := routing.NewIndex(routing.DefaultIndexConfig())
	idx.ReplaceNode("a", 1, 1, nil)
	d1 := newDecider(t, idx)
	s1, err := New(DefaultConfig("r1"), d1, b.join(), nil)
	if err != nil {
		t.Fatal(err)
	}
	s1.Start(t.Context())
	defer s1.Close()
	sender := b.join()
	for _, n := range []string{"forged", "a"} {
		p, err := (&cluster.ShareDecision{RouterID: "r0", NodeID: n, Offset: 0, Hashes: []uint64{1, 2, 3}}).AppendBinary(nil)
		if err != nil {
			t.Fatal(err)
		}
		sender.SendShare(p)
	}
	eventually(t, "the member's decision applied", func() bool { return d1.Overlay().Stats().Pairs == 3 })
	if got := testutil.ToFloat64(s1.m.drops.WithLabelValues("unknown_node")); got != 1 {
		t.Fatalf("unknown_node drops %v, want 1", got)
	}
}

// The first tokens one router observes reach the other's learned fits with the next load tick:
// the peer ends with the same fit as the router that observed them. A peer's observation of a
// node that is not a member is skipped and counted.
func TestSharerSharesFirstTokens(t *testing.T) {
	var b bus
	idx := routing.NewIndex(routing.DefaultIndexConfig())
	idx.ReplaceNode("a", 1, 1, nil)
	d0, d1, _, s1 := startPair(t, &b, idx)

	now := time.Now()
	for i := range 20 {
		toks := make([]uint32, 1000+100*i)
		for j := range toks {
			toks[j] = uint32(i*10007 + j)
		}
		var c routing.Choice
		if err := d0.Decide(&routing.DecideRequest{Tokens: toks}, []routing.NodeInfo{{ID: "a", Alive: true}}, now, routing.CommitBegin, &c); err != nil {
			t.Fatal(err)
		}
		c.Ticket.FirstToken(now.Add(time.Duration(300+20*i) * time.Millisecond))
		c.Ticket.Done(now.Add(time.Second), true)
		now = now.Add(time.Second)
	}
	want := d0.LearnedTTFT("a")
	if !(want.Samples > 19) {
		t.Fatalf("r0 learned from %.1f first tokens, want 20", want.Samples)
	}
	eventually(t, "r1 learns r0's first tokens", func() bool {
		got := d1.LearnedTTFT("a")
		return math.Abs(got.Samples-want.Samples) < 1e-9 && math.Abs(got.Scale-want.Scale) < 1e-6 &&
			math.Abs(got.Overhead-want.Overhead) < 1e-6
	})
	if n := testutil.ToFloat64(s1.m.received.WithLabelValues("ttft")); n < 1 {
		t.Fatalf("received %v ttft packets", n)
	}

	// An observation of a node r1 does not know is skipped.
	m := cluster.ShareTTFT{RouterID: "r0", Obs: []routing.TTFTObservation{{Node: "stranger", Work: time.Second, TTFT: time.Second}}}
	p, err := m.AppendBinary(nil)
	if err != nil {
		t.Fatal(err)
	}
	s1.receive(p)
	eventually(t, "the stranger's observation is skipped", func() bool { return testutil.ToFloat64(s1.m.ttftSkipped) == 1 })
}
