package share

import (
	"sync"
	"testing"
	"time"

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
	d0, d1 := newDecider(t, idx), newDecider(t, idx)
	s0, err := New(DefaultConfig("r0"), d0, b.join(), nil)
	if err != nil {
		t.Fatal(err)
	}
	s1, err := New(DefaultConfig("r1"), d1, b.join(), nil)
	if err != nil {
		t.Fatal(err)
	}
	s0.Start(t.Context())
	s1.Start(t.Context())
	defer s0.Close()
	defer s1.Close()

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
	if d1.Peers() != 1 || d0.Peers() != 1 {
		t.Fatalf("peers %d, %d", d1.Peers(), d0.Peers())
	}
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
