package routerd

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
)

// TestThreeRoutersShareThePinTable runs three routers with --raft-bootstrap-expect=3 and three
// nodes: router-0 (first by id) bootstraps and its reconcile loop makes the others voters; a pin
// written through one router routes on all three; the leader hands over when it drains, and
// writes go on; and with two of three routers gone (no quorum) the last one keeps routing by its
// pins. A fourth router, not a voter, follows the table through gossip.
func TestThreeRoutersShareThePinTable(t *testing.T) {
	h := newHarness(t)
	var routers []map[string]string
	var stops []func()
	var ccs []*grpc.ClientConn
	for i := range 3 {
		extra := []string{"--raft-bootstrap-expect=3", "--raft-listen=" + reservePort(t)}
		if i > 0 {
			extra = append(extra, "--join="+routers[0]["gossip"])
		}
		addrs, stop := h.router(fmt.Sprint("router-", i), extra...)
		routers, stops = append(routers, addrs), append(stops, stop)
		ccs = append(ccs, dialT(t, addrs["grpc"]))
	}
	for i := range 3 {
		h.node(nodeSpec{id: fmt.Sprint("node-", i), kvBlocks: 256}, routers[0]["gossip"], "")
	}
	for i, cc := range ccs {
		h.eventually(fmt.Sprint("router-", i, " routes among the three nodes"), func() error { return routesAmong(cc, 3) })
		h.eventually(fmt.Sprint("router-", i, " knows router-0 leads"), func() error {
			l, err := pb.NewPinsClient(cc).List(context.Background(), &pb.ListPinsRequest{})
			if err != nil {
				return err
			}
			if l.GetLeaderId() != "router-0" {
				return fmt.Errorf("leader %q", l.GetLeaderId())
			}
			return nil
		})
	}

	// Writes through followers are forwarded to the leader.
	write := func(cc *grpc.ClientConn, what string, f func(ctx context.Context, c pb.PinsClient) error) {
		t.Helper()
		h.eventually(what, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return f(ctx, pb.NewPinsClient(cc))
		})
	}
	write(ccs[2], "PutAdapter through router-2", func(ctx context.Context, c pb.PinsClient) error {
		_, err := c.PutAdapter(ctx, &pb.PutAdapterRequest{Adapter: &pb.Adapter{Id: 7, Name: "a7", BaseModel: "prefixmesh-sim"}})
		return err
	})
	write(ccs[1], "PinAdapter through router-1", func(ctx context.Context, c pb.PinsClient) error {
		_, err := c.PinAdapter(ctx, &pb.PinAdapterRequest{AdapterId: 7, Nodes: []string{"node-1"}})
		return err
	})
	routesTo := func(cc *grpc.ClientConn, node string) error {
		for i := range 8 {
			r, err := pb.NewRouterClient(cc).Route(context.Background(), &pb.RouteRequest{Tokens: prompt(1000+100*i, 40), AdapterId: 7})
			if err != nil {
				return err
			}
			if r.GetNodeId() != node {
				return fmt.Errorf("adapter 7 routed to %s", r.GetNodeId())
			}
		}
		return nil
	}
	for i, cc := range ccs {
		h.eventually(fmt.Sprint("router-", i, " routes adapter 7 to node-1"), func() error { return routesTo(cc, "node-1") })
	}
	// A router that is no voter follows a voter's table, found through gossip.
	follower, _ := h.router("router-9", "--raft-voter=false", "--join="+routers[0]["gossip"])
	if follower["raft"] != "-" {
		t.Fatalf("non-voter advertises Raft address %q", follower["raft"])
	}
	fcc := dialT(t, follower["grpc"])
	h.eventually("the non-voter router routes adapter 7 to node-1", func() error { return routesTo(fcc, "node-1") })

	// The leader drains: leadership moves to a live voter and writes go on.
	stops[0]()
	h.eventually("a new leader among router-1 and router-2", func() error {
		l, err := pb.NewPinsClient(ccs[2]).List(context.Background(), &pb.ListPinsRequest{})
		if err != nil {
			return err
		}
		if id := l.GetLeaderId(); !slices.Contains([]string{"router-1", "router-2"}, id) {
			return fmt.Errorf("leader %q", id)
		}
		return nil
	})
	write(ccs[2], "PinAdapter after the handover", func(ctx context.Context, c pb.PinsClient) error {
		_, err := c.PinAdapter(ctx, &pb.PinAdapterRequest{AdapterId: 7, Nodes: []string{"node-2"}})
		return err
	})
	h.eventually("router-2 routes adapter 7 to node-2", func() error { return routesTo(ccs[2], "node-2") })

	// Without quorum, routing goes on from the local table.
	stops[1]()
	if err := routesTo(ccs[2], "node-2"); err != nil {
		t.Fatalf("router-2 alone: %v", err)
	}
	got := post(t, routers[2]["http"], map[string]any{"model": "prefixmesh-sim:7", "prompt": prompt(90000, 40), "max_tokens": 1})
	if got.node != "node-2" {
		t.Fatalf("router-2 alone sent adapter 7 over HTTP to %q, want node-2", got.node)
	}
}

// TestRouterThatLostItsDiskRejoins: a router that restarts without its Raft state, though it
// sorts first and --raft-bootstrap-expect is met, finds the existing cluster's leader and joins
// it instead of founding a second pin cluster; it then holds the existing table.
func TestRouterThatLostItsDiskRejoins(t *testing.T) {
	h := newHarness(t)
	var routers []map[string]string
	var stops []func()
	ports := []string{reservePort(t), reservePort(t), reservePort(t)}
	for i := range 3 {
		extra := []string{"--raft-bootstrap-expect=3", "--raft-listen=" + ports[i]}
		if i > 0 {
			extra = append(extra, "--join="+routers[0]["gossip"])
		}
		addrs, stop := h.router(fmt.Sprint("router-", i), extra...)
		routers, stops = append(routers, addrs), append(stops, stop)
	}
	leaderOf := func(addr string) (string, *pb.ListPinsResponse, error) {
		cc := dialT(t, addr)
		l, err := pb.NewPinsClient(cc).List(context.Background(), &pb.ListPinsRequest{})
		if err != nil {
			return "", nil, err
		}
		return l.GetLeaderId(), l, nil
	}
	cc1 := dialT(t, routers[1]["grpc"])
	h.eventually("PutAdapter through router-1", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := pb.NewPinsClient(cc1).PutAdapter(ctx, &pb.PutAdapterRequest{Adapter: &pb.Adapter{Id: 7, Name: "a7", BaseModel: "m"}})
		return err
	})

	stops[0]()
	h.eventually("a new leader", func() error {
		id, _, err := leaderOf(routers[1]["grpc"])
		if err == nil && id != "router-1" && id != "router-2" {
			err = fmt.Errorf("leader %q", id)
		}
		return err
	})
	again, _ := h.router("router-0", "--raft-bootstrap-expect=3", "--raft-listen="+ports[0],
		"--raft-dir="+filepath.Join(t.TempDir(), "empty"), "--join="+routers[1]["gossip"])
	h.eventually("the restarted router-0 follows the existing cluster", func() error {
		id, l, err := leaderOf(again["grpc"])
		switch {
		case err != nil:
			return err
		case id != "router-1" && id != "router-2":
			return fmt.Errorf("router-0 sees leader %q", id)
		case len(l.GetAdapters()) != 1:
			return fmt.Errorf("router-0 holds %d adapters, want the existing one", len(l.GetAdapters()))
		}
		return nil
	})
	// Raft would also heal a second cluster (the old one's higher term wins), but writes the
	// rogue leader accepted meanwhile would be lost: router-0 must not have bootstrapped at all.
	if !strings.Contains(h.logs.String(), "not bootstrapping: the pin cluster exists") {
		t.Fatalf("router-0 bootstrapped again; logs:\n%s", h.logs)
	}
}

// reservePort returns a free 127.0.0.1 port for a daemon that must know its Raft address
// before it binds (--raft-bootstrap-expect > 1 publishes it in gossip first). The port is free
// when this returns; another process could take it before the daemon binds, which on loopback
// in a test is unlikely enough.
func reservePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}
