package cluster

import (
	"context"
	"errors"
	"net"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/prefixmesh/prefixmesh/local"
	"github.com/prefixmesh/prefixmesh/node"
)

// serveNodeCache serves a NodeCache for id on lis until the test ends; it returns the tree and
// a stop function.
func serveNodeCache(t *testing.T, lis net.Listener, id string, epoch uint64) (*local.RadixTree, func()) {
	t.Helper()
	tree := local.NewRadixTree(local.Options{})
	srv, err := node.New(tree, node.Config{NodeID: id, BlockSize: testBlockSize, Epoch: epoch})
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(srv.ServerOptions()...)
	srv.Register(gs)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	return tree, gs.Stop
}

// TestFetcherRedialsAfterOutage is a node restart: repairs of a node whose gRPC port is
// down fail while grpc-go's reconnect backoff grows; when the node is back on the same address,
// the very next repair must reach it instead of failing until that backoff ends.
func TestFetcherRedialsAfterOutage(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	_ = lis.Close() // nothing listens: connection refused
	f := NewGRPCFetcher()
	defer f.Close()
	m := Meta{Role: RoleNode, NodeID: "node-a", Epoch: 7, GRPCAddr: addr}
	for i := 0; i < 6; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := f.FetchSummary(ctx, m)
		cancel()
		if err == nil {
			t.Fatal("fetch from a closed port succeeded")
		}
	}
	lis, err = net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("port %s taken meanwhile: %v", addr, err)
	}
	tree, _ := serveNodeCache(t, lis, "node-a", 7)
	var blk uint32
	insert(tree, prompt(1, 0, 0, 64), &blk)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	s, err := f.FetchSummary(ctx, m)
	if err != nil {
		t.Fatalf("first repair after the node came back failed: %v", err)
	}
	if s.Epoch != 7 || len(s.Hashes) != 4 {
		t.Fatalf("summary epoch %d with %d hashes, want epoch 7 with 4", s.Epoch, len(s.Hashes))
	}
	t.Logf("first repair after the outage took %v", time.Since(start))
}

// TestFetcherFollowsMembership checks that a connection is replaced when the address moves and
// closed by Forget, and that a closed fetcher refuses.
func TestFetcherFollowsMembership(t *testing.T) {
	f := NewGRPCFetcher()
	var addrs []string
	for i := 0; i < 2; i++ {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addrs = append(addrs, lis.Addr().String())
		serveNodeCache(t, lis, "node-a", uint64(i+1))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i, addr := range addrs {
		s, err := f.FetchSummary(ctx, Meta{Role: RoleNode, NodeID: "node-a", GRPCAddr: addr})
		if err != nil {
			t.Fatal(err)
		}
		if s.Epoch != uint64(i+1) {
			t.Fatalf("fetch %d reached epoch %d", i, s.Epoch)
		}
		if got := f.connAddrs(); len(got) != 1 || got["node-a"] != addr {
			t.Fatalf("connections %v, want only node-a at %s", got, addr)
		}
	}
	f.Forget("node-a")
	if got := f.connAddrs(); len(got) != 0 {
		t.Fatalf("connections after Forget: %v", got)
	}
	_ = f.Close()
	if _, err := f.FetchSummary(ctx, Meta{Role: RoleNode, NodeID: "node-a", GRPCAddr: addrs[0]}); !errors.Is(err, ErrClosed) {
		t.Fatalf("fetch after Close: %v", err)
	}
}

// TestMirrorDropsConnectionsOfDepartedNodes runs a real cluster: a node that leaves loses its
// repair connection, and one that crashes and comes back under the same id with a new gRPC
// address is dialled there and synced (its old blocks gone).
func TestMirrorDropsConnectionsOfDepartedNodes(t *testing.T) {
	routers, nodes := startCluster(t, 1, 3)
	r := routers[0]
	var blk uint32
	p := prompt(9, 0, 0, 64)
	insert(nodes[2].tree, p, &blk)
	waitFor(t, settle, "estimate", func() (bool, string) { return agree(routers, nodes, [][]uint32{p}) })
	if got := r.fetch.connAddrs(); len(got) != 3 {
		t.Fatalf("repair connections %v, want one per node", got)
	}
	nodes[1].stop()
	waitFor(t, settle, "connection of the departed node closed", func() (bool, string) {
		_, ok := r.fetch.connAddrs()["node-1"]
		return !ok, "node-1 still has a repair connection"
	})
	_, port, err := net.SplitHostPort(nodes[2].agent.GossipAddr())
	if err != nil {
		t.Fatal(err)
	}
	old := nodes[2].agent.Meta()
	nodes[2].crash()
	nodes[2] = startNode(t, "node-2", []string{r.agent.GossipAddr()}, func(c *Config) {
		c.BindPort, _ = strconv.Atoi(port)
	})
	now := nodes[2].agent.Meta()
	if now.GRPCAddr == old.GRPCAddr {
		t.Fatalf("restarted node reuses gRPC address %s", now.GRPCAddr)
	}
	live := []*testNode{nodes[0], nodes[2]}
	waitFor(t, settle, "restarted node synced at its new address", func() (bool, string) {
		if ok, msg := caughtUp(routers, live); !ok {
			return false, msg
		}
		if got := r.fetch.connAddrs()["node-2"]; got != now.GRPCAddr {
			return false, "node-2 connection at " + got
		}
		// The new process has an empty tree: the router must estimate 0 for the old prompt.
		return agree(routers, live, [][]uint32{p})
	})
}
