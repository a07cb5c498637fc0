package pins

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"
)

// testConfig returns a Config with raft timeouts tuned for loopback tests.
func testConfig(id, dir, bind string) Config {
	cfg := DefaultConfig()
	cfg.ServerID = id
	cfg.DataDir = dir
	cfg.RaftBind = bind
	// Fast enough for a quick suite, slow enough that the race detector's pauses do not make
	// leaders step down for lack of contact.
	cfg.HeartbeatTimeout = 100 * time.Millisecond
	cfg.ElectionTimeout = 100 * time.Millisecond
	cfg.LeaderLeaseTimeout = 100 * time.Millisecond
	cfg.CommitTimeout = 5 * time.Millisecond
	cfg.TransportTimeout = 2 * time.Second
	cfg.WriteTimeout = 3 * time.Second
	cfg.LogOutput = io.Discard
	if os.Getenv("PINS_RAFT_LOG") != "" {
		cfg.LogOutput = os.Stderr
		cfg.LogLevel = "debug"
	}
	return cfg
}

// waitFor polls cond every few milliseconds until it holds or timeout passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// testNode is one member: a Store plus its gRPC server, restartable on the same raft address.
type testNode struct {
	id, dir, raftAddr string
	store             *Store
	gs                *grpc.Server
	grpcAddr          string
	wg                sync.WaitGroup // joins the gRPC server goroutine
}

type testCluster struct {
	t      testing.TB
	mu     sync.Mutex // guards every node's store, gs and grpcAddr (the nemesis swaps them)
	nodes  []*testNode
	fault  *faultNet
	mutate func(*Config) // optional per-test config changes
}

// newCluster starts n members: node 0 bootstraps, the others join through Reconcile.
func newCluster(t testing.TB, n int, mutate func(*Config)) *testCluster {
	t.Helper()
	c := &testCluster{t: t, fault: newFaultNet(), mutate: mutate}
	base := t.TempDir()
	for i := 0; i < n; i++ {
		c.nodes = append(c.nodes, &testNode{id: fmt.Sprintf("r%d", i), dir: filepath.Join(base, fmt.Sprintf("r%d", i))})
	}
	t.Cleanup(c.close)
	for i := range c.nodes {
		c.start(i, i == 0)
	}
	waitFor(t, 10*time.Second, "node 0 to lead", c.nodes[0].store.IsLeader)
	var members []Member
	for _, nd := range c.nodes {
		members = append(members, Member{ID: nd.id, RaftAddr: nd.raftAddr, GRPCAddr: nd.grpcAddr})
	}
	// Reconcile is idempotent and meant to be called on every membership change: retry it on
	// whoever leads until every member is a voter (a slow join can cost a fresh leader its lease).
	var err error
	waitFor(t, 20*time.Second, "every member to become a voter", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, nd := range c.nodes {
			if nd.store.IsLeader() {
				err = nd.store.Reconcile(ctx, members)
				return err == nil && nd.store.voters() == n
			}
		}
		return false
	})
	c.waitConverged(10 * time.Second)
	return c
}

// start (re)starts member i on its previous raft address (a fresh port the first time).
func (c *testCluster) start(i int, bootstrap bool) {
	c.t.Helper()
	if err := c.startErr(i, bootstrap); err != nil {
		c.t.Fatal(err)
	}
}

// startErr is start for goroutines other than the test's (which must not call t.Fatal).
func (c *testCluster) startErr(i int, bootstrap bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	nd := c.nodes[i]
	if nd.store != nil {
		return nil
	}
	bind := nd.raftAddr
	if bind == "" {
		bind = "127.0.0.1:0"
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("listen grpc: %w", err)
	}
	cfg := testConfig(nd.id, nd.dir, bind)
	cfg.Bootstrap = bootstrap
	cfg.Voters = len(c.nodes)
	cfg.GRPCAddr = lis.Addr().String()
	cfg.WrapStream = c.fault.wrap
	if c.mutate != nil {
		c.mutate(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		_ = lis.Close()
		return fmt.Errorf("new store: %w", err)
	}
	// The OS may hand the old port to someone else between a kill and a restart; retry briefly.
	deadline := time.Now().Add(5 * time.Second)
	for {
		err = s.Start(context.Background())
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		_ = lis.Close()
		return fmt.Errorf("start %s: %w", nd.id, err)
	}
	nd.store = s
	nd.grpcAddr = lis.Addr().String()
	nd.raftAddr = s.RaftAddr()
	nd.gs = grpc.NewServer()
	NewService(s, nil).Register(nd.gs)
	nd.wg.Add(1)
	go func() {
		defer nd.wg.Done()
		_ = nd.gs.Serve(lis)
	}()
	for _, o := range c.nodes {
		if o.store != nil {
			o.store.SetPeer(nd.id, nd.grpcAddr)
			s.SetPeer(o.id, o.grpcAddr)
		}
	}
	return nil
}

// kill crashes member i (no leadership transfer).
func (c *testCluster) kill(i int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	nd := c.nodes[i]
	if nd.store == nil {
		return
	}
	nd.gs.Stop()
	nd.wg.Wait()
	if err := nd.store.stop(); err != nil {
		c.t.Errorf("stop %s: %v", nd.id, err)
	}
	nd.store = nil
}

func (c *testCluster) close() {
	for i := range c.nodes {
		c.kill(i)
	}
}

func (c *testCluster) live() []*testNode {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*testNode
	for _, nd := range c.nodes {
		if nd.store != nil {
			out = append(out, nd)
		}
	}
	return out
}

// leader waits for a live leader that every live member agrees on.
func (c *testCluster) leader(timeout time.Duration) *testNode {
	c.t.Helper()
	var ld *testNode
	waitFor(c.t, timeout, "a leader all live members agree on", func() bool {
		ld = nil
		for _, nd := range c.live() {
			if nd.store.IsLeader() {
				ld = nd
			}
		}
		if ld == nil {
			return false
		}
		for _, nd := range c.live() {
			if id, _ := nd.store.Leader(); id != ld.id {
				return false
			}
		}
		return true
	})
	return ld
}

// waitConverged waits until every live member applied the leader's applied index and holds its
// configuration's voters.
func (c *testCluster) waitConverged(timeout time.Duration) {
	c.t.Helper()
	ld := c.leader(timeout)
	want, voters := ld.store.fsm.AppliedIndex(), ld.store.voters()
	// The voter set too: membership changes are raft's own entries, which the table's applied
	// index does not count. A member still on an older configuration refuses to vote for a
	// member it does not know, so a leader frozen before the last change reached everyone
	// leaves the rest unable ever to elect one.
	waitFor(c.t, timeout, fmt.Sprintf("all members to apply index %d and know %d voters", want, voters), func() bool {
		for _, nd := range c.live() {
			if nd.store.fsm.AppliedIndex() < want || nd.store.voters() != voters {
				return false
			}
		}
		return true
	})
}

func (c *testCluster) follower() *testNode {
	ld := c.leader(10 * time.Second)
	for _, nd := range c.live() {
		if nd != ld {
			return nd
		}
	}
	c.t.Fatal("no follower")
	return nil
}

// faultNet injects partitions between raft addresses: a blocked pair cannot dial and its open
// connections are closed.
type faultNet struct {
	mu      sync.Mutex // guards blocked, conns
	blocked map[[2]string]bool
	conns   map[[2]string]map[net.Conn]bool
}

func newFaultNet() *faultNet {
	return &faultNet{blocked: map[[2]string]bool{}, conns: map[[2]string]map[net.Conn]bool{}}
}

var errPartitioned = errors.New("partitioned by the test")

func (f *faultNet) wrap(sl raft.StreamLayer) raft.StreamLayer {
	return &faultStream{StreamLayer: sl, net: f, self: sl.Addr().String()}
}

// partition cuts (both ways) a from each of others.
func (f *faultNet) partition(a string, others ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, b := range others {
		for _, k := range [][2]string{{a, b}, {b, a}} {
			f.blocked[k] = true
			for conn := range f.conns[k] {
				_ = conn.Close()
			}
			delete(f.conns, k)
		}
	}
}

func (f *faultNet) heal() {
	f.mu.Lock()
	f.blocked = map[[2]string]bool{}
	f.mu.Unlock()
}

type faultStream struct {
	raft.StreamLayer
	net  *faultNet
	self string
}

func (s *faultStream) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	k := [2]string{s.self, string(addr)}
	s.net.mu.Lock()
	blocked := s.net.blocked[k]
	s.net.mu.Unlock()
	if blocked {
		return nil, errPartitioned
	}
	conn, err := s.StreamLayer.Dial(addr, timeout)
	if err != nil {
		return nil, err
	}
	s.net.mu.Lock()
	defer s.net.mu.Unlock()
	if s.net.blocked[k] { // partitioned while dialing
		_ = conn.Close()
		return nil, errPartitioned
	}
	if s.net.conns[k] == nil {
		s.net.conns[k] = map[net.Conn]bool{}
	}
	s.net.conns[k][conn] = true
	return conn, nil
}
