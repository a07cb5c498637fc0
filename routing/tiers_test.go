package routing

import (
	"slices"
	"testing"

	"github.com/prefixmesh/prefixmesh/internal/testenv"
	"github.com/prefixmesh/prefixmesh/local"
)

// tierIndex is an index over a chain of 8 blocks (h[0..7]) where node "a" holds h0–h1 on the GPU
// and h2–h4 on the CPU, then h5 on disk, h6 on no tier and h7 on the CPU (after the gap); "b"
// holds h0 on the GPU and h1 both on the CPU and on disk, then h2 on disk only; "c" holds
// nothing on the GPU and h0–h2 on the CPU; "d" holds all eight on the GPU.
func tierIndex(t *testing.T) (*Index, []uint64) {
	t.Helper()
	h := make([]uint64, 8)
	for i := range h {
		h[i] = uint64(i+1) * 0x9e3779b97f4a7c15
	}
	cpu := func(i int) uint64 { return local.TierKey(h[i], local.TierCPU) }
	disk := func(i int) uint64 { return local.TierKey(h[i], local.TierDisk) }
	x := NewIndex(DefaultIndexConfig())
	x.ReplaceNode("a", 1, 1, []uint64{h[0], h[1], cpu(2), cpu(3), cpu(4), disk(5), cpu(7)})
	x.ReplaceNode("b", 1, 1, []uint64{h[0], cpu(1), disk(1), disk(2)})
	x.ReplaceNode("c", 1, 1, []uint64{cpu(0), cpu(1), cpu(2)})
	x.ReplaceNode("d", 1, 1, h)
	return x, h
}

// TestContinueLower: the lower tiers continue each node's GPU prefix until the first block held
// on no tier; a block on two tiers counts on the faster; a GPU prefix that covers the prompt and
// an unknown node get nothing. The expected counts are read off tierIndex's layout by hand.
func TestContinueLower(t *testing.T) {
	x, h := tierIndex(t)
	nodes := []string{"a", "b", "c", "d", "gone"}
	gpu := make([]int, len(nodes))
	x.Estimate(h, nodes, gpu)
	if want := []int{2, 1, 0, 8, 0}; !slices.Equal(gpu, want) {
		t.Fatalf("GPU blocks %v, want %v (tier keys must not extend the GPU prefix)", gpu, want)
	}
	lower := make([]TierTokens, len(nodes))
	x.ContinueLower(h, nodes, gpu, 16, lower)
	want := []TierTokens{
		{local.TierCPU: 3 * 16, local.TierDisk: 16}, // h2–h4 CPU, h5 disk, gap at h6
		{local.TierCPU: 16, local.TierDisk: 16},     // h1 on both counts as CPU, h2 disk, gap at h3
		{local.TierCPU: 3 * 16},                     // from block 0
		{},                                          // the GPU holds it all
		{},                                          // not in the index
	}
	for i := range nodes {
		if lower[i] != want[i] {
			t.Errorf("node %s: %v, want %v", nodes[i], lower[i], want[i])
		}
	}
	// A node whose GPU prefix is cut short by the caller (a cold node: 0) continues from there.
	x.ContinueLower(h, nodes[:1], []int{0}, 16, lower)
	if lower[0] != (TierTokens{}) {
		t.Errorf("a from block 0: %v, want nothing (h0 is on the GPU only)", lower[0])
	}
	if got := want[0]; got.Total() != 4*16 || got.Lower() != 4*16 {
		t.Errorf("Total %d Lower %d", got.Total(), got.Lower())
	}
}

// TestAllocsContinueLower: the continuation walk allocates nothing in steady state.
func TestAllocsContinueLower(t *testing.T) {
	testenv.SkipAllocsUnderRace(t)
	x, h := tierIndex(t)
	nodes := []string{"a", "b", "c", "d"}
	gpu := []int{2, 1, 0, 8}
	lower := make([]TierTokens, len(nodes))
	if n := testing.AllocsPerRun(100, func() { x.ContinueLower(h, nodes, gpu, 16, lower) }); n != 0 {
		t.Fatalf("ContinueLower allocated %.1f times, want 0", n)
	}
}

func TestParseTierCosts(t *testing.T) {
	c := DefaultPolicyConfig().TierLoadCost
	if err := ParseTierCosts("disk=2, storage=0", &c); err != nil {
		t.Fatal(err)
	}
	if c[local.TierDisk] != 2 || c[local.TierStorage] != 0 || c[local.TierCPU] != 1.0/15 {
		t.Fatalf("%v", c)
	}
	for _, bad := range []string{"gpu=1", "cpu", "cpu=-1", "cpu=x", "tape=1", "cpu=+Inf"} {
		if err := ParseTierCosts(bad, &c); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	var back [local.NumTiers]float64
	if err := ParseTierCosts(FormatTierCosts(DefaultPolicyConfig().TierLoadCost), &back); err != nil || back[local.TierRemote] != 1.4 {
		t.Fatalf("round trip %v %v", back, err)
	}
}
