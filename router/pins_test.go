package router

import (
	"context"
	"errors"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prefixmesh/prefixmesh/local"
	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
	"github.com/prefixmesh/prefixmesh/router/requests"
	"github.com/prefixmesh/prefixmesh/routing"
)

// fakePins is a fixed pin table: adapter → nodes.
type fakePins map[uint64][]string

func (f fakePins) AllowedNodes(adapter uint64) ([]string, bool) {
	n, ok := f[adapter]
	return n, ok
}

// TestRouteRespectsPins: a pinned adapter is routed among its nodes only, even when another
// node holds the whole prompt; an unpinned one may go anywhere; a pin to nodes the router does
// not know answers Unavailable.
func TestRouteRespectsPins(t *testing.T) {
	idx := routing.NewIndex(routing.DefaultIndexConfig())
	p := seq(64, 1000)
	for _, a := range []uint64{0, 7} {
		idx.ReplaceNode("a", 1, 1, local.BlockHashes(p, 16, a)) // a holds the prompt for both adapters
	}
	mirror := fakeMirror{node("a", 16, true, 0), node("b", 16, true, 0), node("c", 16, true, 0)}
	cfg := DefaultConfig()
	table := &SwitchPins{}
	cfg.Pins = table
	srv, err := NewServer(NewView(mirror, idx), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := startServer(t, srv)
	route := func(adapter uint64) (*pb.RouteResponse, error) {
		return c.Route(context.Background(), &pb.RouteRequest{Tokens: p, AdapterId: adapter})
	}
	if r, err := route(7); err != nil || r.NodeId != "a" {
		t.Fatalf("before any pin source: %v %v, want a (it holds the prompt)", r, err)
	}
	table.Set(fakePins{7: {"b", "c"}, 8: {"gone"}})
	for range 10 {
		r, err := route(7)
		if err != nil || (r.NodeId != "b" && r.NodeId != "c") {
			t.Fatalf("adapter 7 pinned to b, c: %v %v", r, err)
		}
		for _, cand := range r.Candidates {
			if cand.NodeId == "a" {
				t.Fatalf("unpinned node a considered: %v", r.Candidates)
			}
		}
	}
	if r, err := route(0); err != nil || r.NodeId != "a" || len(r.Candidates) != 3 {
		t.Fatalf("unpinned adapter 0: %v %v, want a among 3 candidates", r, err)
	}
	if _, err := route(8); status.Code(err) != codes.Unavailable {
		t.Fatalf("adapter 8 pinned to an unknown node: %v, want Unavailable", err)
	}
	table.Set(nil)
	// Every node may serve it again; the overlay now expects the prompt on the pinned nodes it
	// was routed to as well as on a, so any node with the whole prompt cached is right; the
	// estimate is what the engine reports for it, 48 (vLLM recomputes the last block).
	if r, err := route(7); err != nil || len(r.Candidates) != 3 || r.EstimatedMatchedTokens != 48 {
		t.Fatalf("after Set(nil): %v %v, want a node holding all 64 tokens (48 reported) among 3", r, err)
	}
}

// recordingPicker records the exclusions and the allowed set it was asked to honour and answers
// the first of answers (else of a, b, c, d) not excluded and allowed (with ignoreAllowed, not
// excluded), or ErrNoNodes.
type recordingPicker struct {
	exclude       []string
	allowed       *routing.NodeSet
	answers       []string
	ignoreAllowed bool
	done          int // Done calls
}

func (r *recordingPicker) Pick(_ context.Context, req *requests.PickRequest, exclude []string) (requests.Pick, error) {
	r.exclude, r.allowed = append([]string(nil), exclude...), req.Allowed
	cands := r.answers
	if cands == nil {
		cands = []string{"a", "b", "c", "d"}
	}
	for _, a := range cands {
		if !slices.Contains(exclude, a) && (r.ignoreAllowed || req.Allowed == nil || req.Allowed.Has(a)) {
			return requests.Pick{NodeID: a, Done: func(requests.Outcome) { r.done++ }}, nil
		}
	}
	return requests.Pick{}, requests.ErrNoNodes
}

func (r *recordingPicker) Models() []string { return []string{"m"} }

type fixedNodes []string

func (f fixedNodes) Nodes() []requests.NodeTarget {
	out := make([]requests.NodeTarget, len(f))
	for i, id := range f {
		out[i].Info = routing.NodeInfo{ID: id, Alive: true}
	}
	return out
}

func TestPinnedPicker(t *testing.T) {
	inner := &recordingPicker{}
	p := PinnedPicker{Picker: inner, Nodes: fixedNodes{"a", "b", "c", "d"}, Pins: fakePins{7: {"b", "d"}, 8: {"gone"}}}
	ctx := context.Background()
	// The pins reach the picker as its allowed set, not as exclusions; the caller's
	// exclusions pass through as they were.
	if pk, err := p.Pick(ctx, &requests.PickRequest{AdapterID: 7}, []string{"d"}); err != nil || pk.NodeID != "b" {
		t.Fatalf("adapter 7: %q %v, want b", pk.NodeID, err)
	}
	if !slices.Equal(inner.exclude, []string{"d"}) || inner.allowed == nil || inner.allowed.Len() != 2 || !inner.allowed.Has("b") || !inner.allowed.Has("d") {
		t.Fatalf("adapter 7: excluded %v, allowed %v; want d excluded and {b, d} allowed", inner.exclude, inner.allowed)
	}
	// A set the request already had (a gateway's subset hint) is intersected with the pins.
	if pk, err := p.Pick(ctx, &requests.PickRequest{AdapterID: 7, Allowed: routing.NewNodeSet("a", "d")}, nil); err != nil || pk.NodeID != "d" ||
		inner.allowed.Len() != 1 || !inner.allowed.Has("d") {
		t.Fatalf("adapter 7 within {a, d}: %q %v, allowed %v; want d alone", pk.NodeID, err, inner.allowed)
	}
	if _, err := p.Pick(ctx, &requests.PickRequest{AdapterID: 1}, []string{"d"}); err != nil || !slices.Equal(inner.exclude, []string{"d"}) || inner.allowed != nil {
		t.Fatalf("unpinned adapter excluded %v, allowed %v (%v), want just the caller's exclusion", inner.exclude, inner.allowed, err)
	}
	if _, err := p.Pick(ctx, &requests.PickRequest{AdapterID: 8}, nil); !errors.Is(err, requests.ErrNoNodes) {
		t.Fatalf("adapter pinned to no known node: %v, want ErrNoNodes", err)
	}
	// A picker that ignores the allowed set and chooses outside the pins has its pick given
	// back, and the request is re-picked without that node.
	inner.answers, inner.ignoreAllowed = []string{"new", "d"}, true
	pick, err := p.Pick(ctx, &requests.PickRequest{AdapterID: 7}, nil)
	if err != nil || pick.NodeID != "d" || inner.done != 1 {
		t.Fatalf("after a pick outside the pins: %q, %v, %d picks given back; want d, 1", pick.NodeID, err, inner.done)
	}
	if m := p.Models(); !slices.Equal(m, []string{"m"}) {
		t.Fatalf("Models = %v", m)
	}
}
