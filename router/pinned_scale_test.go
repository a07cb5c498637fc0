package router

import (
	"context"
	"fmt"
	"testing"

	"github.com/prefixmesh/prefixmesh/router/requests"
	"github.com/prefixmesh/prefixmesh/routing"
)

// wideFleet is n live nodes of model "m" and a policy picker over them.
func wideFleet(tb testing.TB, n int) (requests.NodeSource, *requests.PolicyPicker) {
	tb.Helper()
	src := make(wideNodes, n)
	idx := routing.NewIndex(routing.DefaultIndexConfig())
	for i := range src {
		src[i] = requests.NodeTarget{EngineURL: "http://e", Info: routing.NodeInfo{ID: fmt.Sprintf("n%05d", i), Alive: true, Model: "m", BlockSize: 16}}
		idx.ReplaceNode(src[i].Info.ID, 1, 0, nil)
	}
	pol, err := routing.NewPolicy(routing.PolicyPrefixMesh, routing.DefaultPolicyConfig())
	if err != nil {
		tb.Fatal(err)
	}
	pp, err := requests.NewPolicyPicker(src, idx, routing.NewOverlay(0, 0), pol, requests.PolicyPickerConfig{})
	if err != nil {
		tb.Fatal(err)
	}
	return src, pp
}

type wideNodes []requests.NodeTarget

func (w wideNodes) Nodes() []requests.NodeTarget { return w }

// BenchmarkPinnedPick is a pick for an adapter pinned to one node of n: the pins cost linear
// work in n (a set built once, a lookup per node), not a list of n-1 exclusions scanned per node.
func BenchmarkPinnedPick(b *testing.B) {
	for _, n := range []int{1000, 4000} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			src, pp := wideFleet(b, n)
			last := src.Nodes()[n-1].Info.ID
			p := PinnedPicker{Picker: pp, Nodes: src, Pins: fakePins{7: {last}}}
			req := &requests.PickRequest{AdapterID: 7, Model: "m", Tokens: make([]uint32, 64)}
			b.ResetTimer()
			for range b.N {
				pk, err := p.Pick(context.Background(), req, nil)
				if err != nil || pk.NodeID != last {
					b.Fatalf("pick %q, %v", pk.NodeID, err)
				}
				pk.Done(requests.Outcome{Status: 200})
			}
		})
	}
}

// countingPicker passes picks to a real picker and records what each asked it to honour.
type countingPicker struct {
	requests.Picker
	exclude, allowed int
}

func (c *countingPicker) Pick(ctx context.Context, req *requests.PickRequest, exclude []string) (requests.Pick, error) {
	c.exclude = len(exclude)
	c.allowed = -1
	if req.Allowed != nil {
		c.allowed = req.Allowed.Len()
	}
	return c.Picker.Pick(ctx, req, exclude)
}

// A pick over 1,000 nodes for an adapter pinned to one of them hands the policy picker the pins
// as a set of one (tested per node in O(1)) and no exclusion list: before, it got the other 999
// as exclusions, each scanned for every node listed.
func TestPinnedPickIsLinear(t *testing.T) {
	const n = 1000
	src, pp := wideFleet(t, n)
	last := src.Nodes()[n-1].Info.ID
	inner := &countingPicker{Picker: pp}
	p := PinnedPicker{Picker: inner, Nodes: src, Pins: fakePins{7: {last}}}
	pk, err := p.Pick(context.Background(), &requests.PickRequest{AdapterID: 7, Model: "m", Tokens: make([]uint32, 64)}, nil)
	if err != nil || pk.NodeID != last {
		t.Fatalf("pick %q, %v; want %s", pk.NodeID, err, last)
	}
	pk.Done(requests.Outcome{Status: 200})
	if inner.exclude != 0 || inner.allowed != 1 {
		t.Fatalf("the picker got %d exclusions and an allowed set of %d, want none and 1", inner.exclude, inner.allowed)
	}
}
