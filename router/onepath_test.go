package router

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/prefixmesh/prefixmesh/local"
	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
	"github.com/prefixmesh/prefixmesh/router/requests"
	"github.com/prefixmesh/prefixmesh/routing"
)

// replica is one router process's decision state over a shared view: its own Decider (own
// overlay, in-flight counts and policy instance), its gRPC Route and its front-door picker.
type replica struct {
	route  pb.RouterClient
	picker *requests.PolicyPicker
}

func newReplica(t *testing.T, mirror fakeMirror, idx *routing.Index) replica {
	t.Helper()
	pol, err := routing.NewPolicy(routing.PolicyPrefixMesh, routing.DefaultPolicyConfig())
	if err != nil {
		t.Fatal(err)
	}
	d, err := routing.NewDecider(idx, routing.NewOverlay(0, 0), pol, routing.DeciderConfig{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Decider = d
	srv, err := NewServer(NewView(mirror, idx), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	pk, err := requests.NewDeciderPicker(requests.MirrorNodes{M: mirror}, d, requests.PolicyPickerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return replica{route: startServer(t, srv), picker: pk}
}

// Two replicas with the same view agree on every session, whichever door each request takes:
// the session key is routing.SessionKey on both paths (no per-process seed), and gRPC Route and
// the request service's picker decide through the same Decider code.
func TestReplicasAgreeOnSessionsOverBothPaths(t *testing.T) {
	idx := routing.NewIndex(routing.DefaultIndexConfig())
	var mirror fakeMirror
	for i := range 8 {
		id := fmt.Sprintf("n%d", i)
		mirror = append(mirror, node(id, 16, true, 0))
		idx.ReplaceNode(id, 1, 1, nil)
	}
	a, b := newReplica(t, mirror, idx), newReplica(t, mirror, idx)
	ctx := context.Background()
	spread := map[string]int{}
	for s := range 64 {
		session := fmt.Sprintf("conversation-%d", s)
		toks := seq(48, uint32(1000*s))
		ra, err := a.route.Route(ctx, &pb.RouteRequest{Tokens: toks, SessionId: session})
		if err != nil {
			t.Fatal(err)
		}
		rb, err := b.route.Route(ctx, &pb.RouteRequest{Tokens: toks, SessionId: session})
		if err != nil {
			t.Fatal(err)
		}
		req := &requests.PickRequest{Tokens: toks, SessionKey: headerSessionKey(t, session)}
		pa, err := a.picker.Pick(ctx, req, nil)
		if err != nil {
			t.Fatal(err)
		}
		pb2, err := b.picker.Pick(ctx, req, nil)
		if err != nil {
			t.Fatal(err)
		}
		pa.Done(requests.Outcome{Status: 200})
		pb2.Done(requests.Outcome{Status: 200})
		if ra.NodeId != rb.NodeId || ra.NodeId != pa.NodeID || pa.NodeID != pb2.NodeID {
			t.Fatalf("session %q: gRPC %s / %s, HTTP %s / %s", session, ra.NodeId, rb.NodeId, pa.NodeID, pb2.NodeID)
		}
		if ra.Reason != routing.ReasonSession || pa.Reason != routing.ReasonSession {
			t.Fatalf("session %q: reasons %q, %q", session, ra.Reason, pa.Reason)
		}
		spread[ra.NodeId]++
	}
	if len(spread) < 4 {
		t.Fatalf("64 sessions landed on %d of 8 nodes: %v", len(spread), spread)
	}
}

// headerSessionKey is the key the request service derives from an X-Session-ID header
// (requests.ParseGen), as the front door and the endpoint picker read it.
func headerSessionKey(t *testing.T, name string) uint64 {
	t.Helper()
	h := http.Header{}
	h.Set(requests.HeaderSessionID, name)
	g, err := requests.ParseGen([]byte(`{"prompt":"x"}`), false, h)
	if err != nil {
		t.Fatal(err)
	}
	return g.Session
}

// A Route decision and a front-door decision on the same replica are the same code: a prefix
// routed through gRPC is expected on its node by the next front-door request (the overlay is
// shared), and vice versa.
func TestRouteAndFrontDoorShareState(t *testing.T) {
	idx := routing.NewIndex(routing.DefaultIndexConfig())
	var mirror fakeMirror
	for i := range 4 {
		id := fmt.Sprintf("n%d", i)
		mirror = append(mirror, node(id, 16, true, 0))
		idx.ReplaceNode(id, 1, 1, nil)
	}
	r := newReplica(t, mirror, idx)
	toks := seq(256, 7)
	resp, err := r.route.Route(context.Background(), &pb.RouteRequest{Tokens: toks})
	if err != nil {
		t.Fatal(err)
	}
	longer := append(append([]uint32(nil), toks...), seq(64, 90000)...)
	pk, err := r.picker.Pick(context.Background(), &requests.PickRequest{Tokens: longer}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pk.Done(requests.Outcome{Status: 200})
	if pk.NodeID != resp.NodeId || pk.EstimatedMatchedTokens != 256 {
		t.Fatalf("front door chose %s with %d matched; Route had sent the prefix to %s", pk.NodeID, pk.EstimatedMatchedTokens, resp.NodeId)
	}
}

// A dry-run Route explains its decision without recording it: a later front-door request for a
// longer prompt finds nothing expected anywhere, where a recorded Route would have steered it.
func TestDryRunRouteRecordsNothing(t *testing.T) {
	idx := routing.NewIndex(routing.DefaultIndexConfig())
	var mirror fakeMirror
	for i := range 4 {
		id := fmt.Sprintf("n%d", i)
		mirror = append(mirror, node(id, 16, true, 0))
		idx.ReplaceNode(id, 1, 1, nil)
	}
	r := newReplica(t, mirror, idx)
	toks := seq(256, 7)
	for range 3 {
		resp, err := r.route.Route(context.Background(), &pb.RouteRequest{Tokens: toks, DryRun: true})
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetEstimatedMatchedTokens() != 0 {
			t.Fatalf("dry run saw %d tokens expected on %s: an earlier dry run was recorded", resp.GetEstimatedMatchedTokens(), resp.GetNodeId())
		}
	}
	longer := append(append([]uint32(nil), toks...), seq(64, 90000)...)
	pk, err := r.picker.Pick(context.Background(), &requests.PickRequest{Tokens: longer}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pk.Done(requests.Outcome{Status: 200})
	if pk.EstimatedMatchedTokens != 0 {
		t.Fatalf("front door expects %d tokens on %s after dry runs only", pk.EstimatedMatchedTokens, pk.NodeID)
	}
}

// ejectSet is a fake of the front door's passive health.
type ejectSet map[string]bool

func (e ejectSet) Ejected(id string) bool { return e[id] }

// Both doors choose among the same nodes: one the front door's passive health ejected is out of
// gRPC Route's candidates too, however much of the prompt it holds; a draining node is out of
// both. Before the fix Route sent the request to the ejected node with the prefix.
func TestRouteAndFrontDoorShareEligibility(t *testing.T) {
	idx := routing.NewIndex(routing.DefaultIndexConfig())
	toks := seq(256, 5)
	mirror := fakeMirror{node("hot", 16, true, 0), node("drain", 16, true, 0), node("n1", 16, true, 0), node("n2", 16, true, 0)}
	mirror[1].Meta.Draining = true
	for _, n := range mirror {
		idx.ReplaceNode(n.Meta.NodeID, 1, 1, nil)
	}
	idx.ReplaceNode("hot", 1, 2, local.BlockHashes(toks, 16, 0))
	idx.ReplaceNode("drain", 1, 2, local.BlockHashes(toks, 16, 0))
	eject := ejectSet{"hot": true}
	pol, err := routing.NewPolicy(routing.PolicyPrefixMesh, routing.DefaultPolicyConfig())
	if err != nil {
		t.Fatal(err)
	}
	d, err := routing.NewDecider(idx, routing.NewOverlay(0, 0), pol, routing.DeciderConfig{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Decider, cfg.Ejector = d, eject
	srv, err := NewServer(NewView(mirror, idx), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	route := startServer(t, srv)
	pk, err := requests.NewDeciderPicker(requests.MirrorNodes{M: mirror}, d, requests.PolicyPickerConfig{Ejector: eject})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for range 8 {
		r, err := route.Route(ctx, &pb.RouteRequest{Tokens: toks, DryRun: true})
		if err != nil {
			t.Fatal(err)
		}
		p, err := pk.Pick(ctx, &requests.PickRequest{Tokens: toks}, nil)
		if err != nil {
			t.Fatal(err)
		}
		p.Done(requests.Outcome{Status: 200})
		for _, id := range []string{r.NodeId, p.NodeID} {
			if id == "hot" || id == "drain" {
				t.Fatalf("gRPC chose %s, the front door %s: an ejected or draining node", r.NodeId, p.NodeID)
			}
		}
		for _, c := range r.Candidates {
			if c.NodeId == "hot" || c.NodeId == "drain" {
				t.Fatalf("gRPC candidates include %s", c.NodeId)
			}
		}
	}
	// Un-ejected, the node with the prefix wins on both doors.
	delete(eject, "hot")
	r, err := route.Route(ctx, &pb.RouteRequest{Tokens: toks, DryRun: true})
	if err != nil || r.NodeId != "hot" {
		t.Fatalf("after recovery gRPC chose %v (%v)", r.GetNodeId(), err)
	}
}
