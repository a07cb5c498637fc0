package cluster

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"google.golang.org/grpc"

	"github.com/prefixmesh/prefixmesh/local"
	"github.com/prefixmesh/prefixmesh/node"
	"github.com/prefixmesh/prefixmesh/routing"
)

const testBlockSize = 16

var testKey = []byte("0123456789abcdef")

// waitFor polls cond every few milliseconds until it holds or timeout passes; the failure names
// what cond last reported.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for {
		ok, msg := cond()
		if ok {
			return
		}
		last = msg
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %s", what, timeout, last)
		}
		time.Sleep(3 * time.Millisecond)
	}
}

// testConfig is a loopback member with an OS-chosen port and fast timers.
func testConfig(role Role, id string) Config {
	c := DefaultConfig(role, id)
	c.BindAddr, c.BindPort = "127.0.0.1", 0
	c.Profile = "local"
	c.Keys = [][]byte{testKey}
	c.PublishInterval = 5 * time.Millisecond
	c.LoadInterval = 20 * time.Millisecond
	c.HeartbeatInterval = 100 * time.Millisecond
	c.ReorderWindow = 30 * time.Millisecond
	c.LagTimeout = 200 * time.Millisecond
	c.SilenceTimeout = time.Second
	c.TickInterval = 10 * time.Millisecond
	c.RepairBackoff = 10 * time.Millisecond
	c.MaxRepairBackoff = 200 * time.Millisecond
	c.JoinRetryInterval = 50 * time.Millisecond
	c.LeaveTimeout = time.Second
	c.tune = func(mc *memberlist.Config) {
		// Fast gossip, but failure detection tolerant of a loaded CI machine: tests end members
		// with a graceful leave, never by timing out probes.
		mc.GossipInterval = 20 * time.Millisecond
		mc.PushPullInterval = time.Second
		mc.ProbeInterval = time.Second
		mc.ProbeTimeout = time.Second
		mc.SuspicionMult = 6
		mc.TCPTimeout = 10 * time.Second
	}
	return c
}

type testNode struct {
	id    string
	tree  *local.RadixTree
	srv   *node.Server // its NodeCache server (GetSummary, the epoch repairs check)
	agent *Agent
	gs    *grpc.Server
}

type testRouter struct {
	id    string
	idx   *routing.Index
	agent *Agent
	fetch *GRPCFetcher
	fault *faults
}

// faults is a router's receive-path hook: it can drop or reorder delta packets.
type faults struct {
	mode      atomic.Int32 // faultNone, faultDrop, faultReorder
	budget    atomic.Int32 // packets left to affect
	mu        sync.Mutex   // guards held
	held      []byte
	dropped   atomic.Int32
	reordered atomic.Int32
}

const (
	faultNone = iota
	faultDrop
	faultReorder
)

func (f *faults) hook(b []byte) [][]byte {
	if len(b) == 0 || b[0] != msgDelta || f.mode.Load() == faultNone {
		return [][]byte{b}
	}
	if f.budget.Add(-1) < 0 {
		f.mode.Store(faultNone)
		return f.release(b)
	}
	switch f.mode.Load() {
	case faultDrop:
		f.dropped.Add(1)
		return nil
	case faultReorder:
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.held == nil {
			f.held = b
			return nil
		}
		out := [][]byte{b, f.held} // the later packet first
		f.held = nil
		f.reordered.Add(1)
		return out
	}
	return [][]byte{b}
}

func (f *faults) release(b []byte) [][]byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := [][]byte{b}
	if f.held != nil {
		out = append(out, f.held)
		f.held = nil
	}
	return out
}

func startRouter(t testing.TB, id string, seeds []string, mods ...func(*Config)) *testRouter {
	t.Helper()
	r := &testRouter{id: id, idx: routing.NewIndex(routing.DefaultIndexConfig()), fetch: NewGRPCFetcher(), fault: &faults{}}
	cfg := testConfig(RoleRouter, id)
	for _, m := range mods {
		m(&cfg)
	}
	a, err := New(cfg, Deps{Index: r.idx, Fetcher: r.fetch})
	if err != nil {
		t.Fatal(err)
	}
	a.recvHook = r.fault.hook
	r.agent = a
	startAndJoin(t, a, seeds)
	t.Cleanup(func() {
		_ = a.Close(context.Background())
		_ = r.fetch.Close()
	})
	return r
}

func startNode(t testing.TB, id string, seeds []string, mods ...func(*Config)) *testNode {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n := &testNode{id: id, tree: local.NewRadixTree(local.Options{})}
	cfg := testConfig(RoleNode, id)
	cfg.Meta.GRPCAddr = lis.Addr().String()
	cfg.Meta.BlockSize = testBlockSize
	cfg.Meta.Epoch = rand.Uint64() | 1
	for _, m := range mods {
		m(&cfg)
	}
	srv, err := node.New(n.tree, node.Config{NodeID: id, BlockSize: testBlockSize, Epoch: cfg.Meta.Epoch})
	if err != nil {
		t.Fatal(err)
	}
	n.srv = srv
	n.gs = grpc.NewServer(srv.ServerOptions()...)
	srv.Register(n.gs)
	go func() { _ = n.gs.Serve(lis) }()
	n.agent, err = New(cfg, Deps{Source: n.tree})
	if err != nil {
		t.Fatal(err)
	}
	startAndJoin(t, n.agent, seeds)
	t.Cleanup(n.stop)
	return n
}

// crash stops the node without leaving: no leave message, the gossip port closed.
func (n *testNode) crash() {
	n.agent.mu.Lock()
	n.agent.closed = true
	n.agent.mu.Unlock()
	n.agent.cancel()
	n.agent.wg.Wait()
	_ = n.agent.ml.Shutdown()
	n.gs.Stop()
}

func (n *testNode) stop() {
	_ = n.agent.Close(context.Background())
	n.gs.Stop()
}

func startAndJoin(t testing.TB, a *Agent, seeds []string) {
	t.Helper()
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(seeds) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := a.Join(ctx, seeds); err != nil {
			t.Fatal(err)
		}
	}
}

// prompt returns n tokens: a shared prefix of `shared` tokens from family, then unique ones.
func prompt(family, variant uint32, shared, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		if i < shared {
			out[i] = family*100000 + uint32(i)
		} else {
			out[i] = family*100000 + variant*1000 + uint32(i) + 50000
		}
	}
	return out
}

// insert caches tokens on the tree as a finished sequence (Insert then Release).
func insert(tree *local.RadixTree, tokens []uint32, nextBlock *uint32) {
	nb := (len(tokens) + testBlockSize - 1) / testBlockSize
	bt := make([]uint32, nb)
	for i := range bt {
		*nextBlock++
		bt[i] = *nextBlock
	}
	tree.Insert(tokens, bt, nil, testBlockSize, 0, 0)
	tree.Release(tokens, testBlockSize, 0)
}

// agree checks that every router's estimate equals every node's peek for every prompt.
func agree(routers []*testRouter, nodes []*testNode, prompts [][]uint32) (bool, string) {
	ids := make([]string, len(nodes))
	for i, n := range nodes {
		ids[i] = n.id
	}
	got := make([]int, len(nodes))
	for _, p := range prompts {
		hashes := local.BlockHashes(p, testBlockSize, 0)
		for _, r := range routers {
			r.idx.Estimate(hashes, ids, got)
			for i, n := range nodes {
				want := n.tree.PeekMatchedTokens(p, testBlockSize, 0)
				if got[i]*testBlockSize != want {
					return false, fmt.Sprintf("router %s estimates %d tokens on %s, the node peeks %d", r.id, got[i]*testBlockSize, n.id, want)
				}
			}
		}
	}
	return true, ""
}

// synced reports whether every router mirrors exactly the given nodes, all synced.
func synced(routers []*testRouter, nodes []*testNode) (bool, string) {
	for _, r := range routers {
		ns := r.agent.Mirror().Nodes()
		if len(ns) != len(nodes) || !r.agent.Mirror().Synced() {
			return false, fmt.Sprintf("router %s mirrors %d of %d nodes, synced=%v", r.id, len(ns), len(nodes), r.agent.Mirror().Synced())
		}
	}
	return true, ""
}
