package router

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/prefixmesh/prefixmesh/cluster"
	"github.com/prefixmesh/prefixmesh/internal/tokenizer"
	"github.com/prefixmesh/prefixmesh/local"
	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
	"github.com/prefixmesh/prefixmesh/router/requests"
	"github.com/prefixmesh/prefixmesh/routing"
)

// fakeMirror is a fixed node list.
type fakeMirror []cluster.NodeStatus

func (f fakeMirror) Nodes() []cluster.NodeStatus { return f }

func node(id string, bs uint32, synced bool, running uint32) cluster.NodeStatus {
	return cluster.NodeStatus{
		Meta:     cluster.Meta{Role: cluster.RoleNode, NodeID: id, GRPCAddr: id + ":7000", EngineURL: "http://" + id, BlockSize: bs, Model: "m"},
		Load:     cluster.Load{Running: running},
		LoadRecv: time.Now(),
		Synced:   synced,
	}
}

func seq(n int, base uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = base + uint32(i)
	}
	return out
}

// startServer serves the Router service on 127.0.0.1:0 and returns a client.
func startServer(t *testing.T, srv *Server) pb.RouterClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	srv.Register(g)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return pb.NewRouterClient(cc)
}

func TestRouteLongestPrefix(t *testing.T) {
	idx := routing.NewIndex(routing.DefaultIndexConfig())
	p := seq(100, 1000)
	idx.ReplaceNode("a", 1, 1, local.BlockHashes(p[:32], 16, 0))
	idx.ReplaceNode("b", 1, 1, local.BlockHashes(p, 16, 0))
	idx.ReplaceNode("c", 1, 1, nil)
	idx.ReplaceNode("d", 1, 1, local.BlockHashes(p, 16, 0)) // holds it all but never synced
	mirror := fakeMirror{node("a", 16, true, 0), node("b", 16, true, 3), node("c", 16, true, 0), node("d", 16, false, 0)}
	cfg := DefaultConfig()
	tok, err := tokenizer.New(tokenizer.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Tokenizer = tok
	srv, err := NewServer(NewView(mirror, idx), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := startServer(t, srv)
	ctx := context.Background()

	resp, err := c.Route(ctx, &pb.RouteRequest{Tokens: p})
	if err != nil {
		t.Fatal(err)
	}
	if resp.NodeId != "b" || resp.EstimatedMatchedTokens != 96 || resp.GrpcAddress != "b:7000" || resp.EngineUrl != "http://b" {
		t.Fatalf("got %+v, want node b with 96 tokens", resp)
	}
	if resp.Reason != routing.ReasonLongestPrefix || len(resp.Candidates) != 3 || resp.PromptTokens != 100 {
		t.Fatalf("reason %q, %d candidates, %d prompt tokens", resp.Reason, len(resp.Candidates), resp.PromptTokens)
	}
	want := map[string]int64{"a": 32, "b": 96, "c": 0}
	for _, cand := range resp.Candidates {
		if want[cand.NodeId] != cand.EstimatedMatchedTokens {
			t.Fatalf("candidate %s: %d tokens, want %d", cand.NodeId, cand.EstimatedMatchedTokens, want[cand.NodeId])
		}
	}

	// A prompt nobody holds ties at 0 tokens: the least loaded, then the rendezvous hash decide,
	// the same way every time.
	first, err := c.Route(ctx, &pb.RouteRequest{Tokens: seq(64, 9)})
	if err != nil {
		t.Fatal(err)
	}
	if first.NodeId == "b" || first.EstimatedMatchedTokens != 0 {
		t.Fatalf("cold prompt went to %s (%d tokens)", first.NodeId, first.EstimatedMatchedTokens)
	}
	for i := 0; i < 5; i++ {
		again, _ := c.Route(ctx, &pb.RouteRequest{Tokens: seq(64, 9)})
		if again.GetNodeId() != first.NodeId {
			t.Fatal("tie-break is not deterministic")
		}
	}

	// Text is tokenised (the bytes tokenizer: one token per byte).
	if resp, err := c.Route(ctx, &pb.RouteRequest{Text: "hello, world, this is a prompt"}); err != nil || resp.PromptTokens != 30 {
		t.Fatalf("text: %v %+v", err, resp)
	}

	for _, bad := range []*pb.RouteRequest{{}, {Tokens: p, Text: "x"}, {Tokens: make([]uint32, requests.MaxPromptTokens+1)}} {
		if _, err := c.Route(ctx, bad); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("bad request: %v", err)
		}
	}
	if _, err := c.Route(ctx, &pb.RouteRequest{Tokens: p, Model: "other"}); status.Code(err) != codes.Unavailable {
		t.Fatalf("unknown model: %v", err)
	}
}

// A node flagged cold in its gossip metadata (its mirror is partial) gets no prefix affinity
// through the router's view and decision: the warm node with the shorter match wins, both
// candidates stay, and the view's own estimate for the cold node is 0.
func TestRouteColdNode(t *testing.T) {
	idx := routing.NewIndex(routing.DefaultIndexConfig())
	p := seq(100, 1000)
	idx.ReplaceNode("a", 1, 1, local.BlockHashes(p[:32], 16, 0))
	idx.ReplaceNode("b", 1, 1, local.BlockHashes(p, 16, 0))
	cold := node("b", 16, true, 0)
	cold.Meta.Cold = true
	v := NewView(fakeMirror{node("a", 16, true, 0), cold}, idx)
	srv, err := NewServer(v, DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := startServer(t, srv).Route(context.Background(), &pb.RouteRequest{Tokens: p})
	if err != nil {
		t.Fatal(err)
	}
	if resp.NodeId != "a" || resp.EstimatedMatchedTokens != 32 || len(resp.Candidates) != 2 {
		t.Fatalf("got %+v; want a with 32 tokens, the cold b still a candidate", resp)
	}
	for _, c := range resp.Candidates {
		if c.NodeId == "b" && c.EstimatedMatchedTokens != 0 {
			t.Fatalf("cold b estimated at %d tokens, want 0", c.EstimatedMatchedTokens)
		}
	}
	var s Snapshot
	v.For(p, 0, &s)
	for i, n := range s.Nodes {
		if n.ID == "b" && (!n.Cold || s.MatchedTokens[i] != 0) {
			t.Fatalf("view of b: cold %v, %d tokens; want cold with 0", n.Cold, s.MatchedTokens[i])
		}
	}
}

func TestViewMixedBlockSizes(t *testing.T) {
	idx := routing.NewIndex(routing.DefaultIndexConfig())
	p := seq(64, 5)
	idx.ReplaceNode("x16", 1, 1, local.BlockHashes(p, 16, 7))
	idx.ReplaceNode("y32", 1, 1, local.BlockHashes(p[:32], 32, 7))
	idx.ReplaceNode("z16", 1, 1, nil)
	v := NewView(fakeMirror{node("x16", 16, true, 0), node("y32", 32, true, 0), node("z16", 16, true, 0)}, idx)
	var s Snapshot
	v.For(p, 7, &s)
	if s.BlockSize != 16 || len(s.Hashes) != 4 {
		t.Fatalf("block size %d with %d hashes", s.BlockSize, len(s.Hashes))
	}
	got := map[string]int{}
	for i, n := range s.Nodes {
		got[n.ID] = s.MatchedTokens[i]
	}
	if got["x16"] != 64 || got["y32"] != 32 || got["z16"] != 0 {
		t.Fatalf("estimates %v", got)
	}
}

// View.For over nodes of two block sizes allocates nothing in steady state. Named ...Allocs so
// that scripts/test.sh's pass without the race detector runs it.
func TestViewForAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector drops sync.Pool entries at random; scripts/test.sh runs this test without it")
	}
	idx := routing.NewIndex(routing.DefaultIndexConfig())
	p := seq(64, 5)
	idx.ReplaceNode("x16", 1, 1, local.BlockHashes(p, 16, 7))
	idx.ReplaceNode("y32", 1, 1, local.BlockHashes(p[:32], 32, 7))
	v := NewView(fakeMirror{node("x16", 16, true, 0), node("y32", 32, true, 0)}, idx)
	var s Snapshot
	v.For(p, 7, &s)
	if n := testing.AllocsPerRun(100, func() { v.For(p, 7, &s) }); n > 0 {
		t.Fatalf("View.For allocates %v times per call in steady state", n)
	}
}

func TestRouteWithoutTokenizer(t *testing.T) {
	srv, err := NewServer(NewView(fakeMirror{}, routing.NewIndex(routing.DefaultIndexConfig())), DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Route(context.Background(), &pb.RouteRequest{Text: "hi"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("text without tokenizer: %v", err)
	}
	if _, err := srv.Route(context.Background(), &pb.RouteRequest{Tokens: []uint32{1}}); status.Code(err) != codes.Unavailable {
		t.Fatalf("no nodes: %v", err)
	}
}

// Route under P/D: a prefill-only node is never the answer's node, and with a busy decode node
// the answer names the idle prefill node too (its reason: remote-faster); with --disaggregate
// never, or no prefill node, it names none.
func TestRoutePrefillDecode(t *testing.T) {
	idx := routing.NewIndex(routing.DefaultIndexConfig())
	p := seq(8192, 1)
	idx.ReplaceNode("d", 1, 1, nil)
	idx.ReplaceNode("p", 1, 1, nil)
	dn, pn := node("d", 16, true, 0), node("p", 16, true, 0)
	dn.Meta.Serving, pn.Meta.Serving = cluster.ServeDecode, cluster.ServePrefill
	dn.Load.QueuedPrefillTokens = 40000 // 4 s of prefill ahead at the default rate
	for _, tc := range []struct {
		name        string
		mode        routing.DisaggMode
		mirror      fakeMirror
		wantNode    string
		wantPrefill string
		wantReason  string
	}{
		{"busy decode node", routing.DisaggAuto, fakeMirror{dn, pn}, "d", "p", routing.PrefillRemoteFaster},
		{"never", routing.DisaggNever, fakeMirror{dn, pn}, "d", "", routing.PrefillLocalNever},
		{"no prefill node", routing.DisaggAuto, fakeMirror{dn}, "d", "", routing.PrefillLocalNoNode},
	} {
		cfg := DefaultConfig()
		cfg.Policy = routing.PolicyPrefixMesh
		cfg.Disaggregate = tc.mode
		srv, err := NewServer(NewView(tc.mirror, idx), cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := startServer(t, srv).Route(context.Background(), &pb.RouteRequest{Tokens: p, DryRun: true})
		if err != nil {
			t.Fatal(err)
		}
		if resp.NodeId != tc.wantNode || resp.PrefillNodeId != tc.wantPrefill || resp.PrefillReason != tc.wantReason {
			t.Errorf("%s: node %q prefill %q (%s), want %q, %q (%s)", tc.name, resp.NodeId, resp.PrefillNodeId, resp.PrefillReason,
				tc.wantNode, tc.wantPrefill, tc.wantReason)
		}
		if tc.wantPrefill != "" && (resp.PrefillEngineUrl != "http://p" || resp.PrefillGrpcAddress != "p:7000") {
			t.Errorf("%s: prefill addresses %q %q", tc.name, resp.PrefillEngineUrl, resp.PrefillGrpcAddress)
		}
	}
}

// Route with a peer pull: the holder of the prompt is busy, so the answer is an idle node and
// names the holder as the KV source, with its announced KV endpoint and the tokens the pull
// brings (all whole blocks but the last token's: 8,176 of 8,192); without an endpoint, or with
// --peer-pull=false, it names none.
func TestRoutePeerPull(t *testing.T) {
	idx := routing.NewIndex(routing.DefaultIndexConfig())
	p := seq(8192, 1)
	idx.ReplaceNode("a", 1, 1, nil)
	idx.ReplaceNode("h", 1, 1, local.BlockHashes(p, 16, 0))
	a, h := node("a", 16, true, 0), node("h", 16, true, 0)
	h.Load.QueuedPrefillTokens = 200000
	silent := h
	h.Meta.KVPeerAddr = "10.0.0.8:5600"
	for _, tc := range []struct {
		name     string
		mirror   fakeMirror
		pull     bool
		wantAddr string
	}{
		{"pull", fakeMirror{a, h}, true, "10.0.0.8:5600"},
		{"holder names no endpoint", fakeMirror{a, silent}, true, ""},
		{"off", fakeMirror{a, h}, false, ""},
	} {
		cfg := DefaultConfig()
		cfg.Policy = routing.PolicyPrefixMesh
		cfg.PolicyConfig.PeerPull = tc.pull
		srv, err := NewServer(NewView(tc.mirror, idx), cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := startServer(t, srv).Route(context.Background(), &pb.RouteRequest{Tokens: p, DryRun: true})
		if err != nil {
			t.Fatal(err)
		}
		if resp.NodeId != "a" {
			t.Fatalf("%s: node %q, want the idle a", tc.name, resp.NodeId)
		}
		if resp.KvSourceAddress != tc.wantAddr {
			t.Fatalf("%s: KV source %q at %q, want %q", tc.name, resp.KvSourceNodeId, resp.KvSourceAddress, tc.wantAddr)
		}
		if tc.wantAddr != "" && (resp.KvSourceNodeId != "h" || resp.KvSourceTokens != 8176 || resp.EstimatedMatchedTokens != 8176) {
			t.Fatalf("%s: source %q, %d tokens, estimate %d; want h, 8176, 8176", tc.name, resp.KvSourceNodeId, resp.KvSourceTokens, resp.EstimatedMatchedTokens)
		}
	}
}
