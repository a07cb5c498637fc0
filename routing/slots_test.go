package routing

import (
	"slices"
	"testing"
	"time"
)

// TestIDMemo: an answer is reused only for the same id at the same position and the same
// generation; anything else is looked up again.
func TestIDMemo(t *testing.T) {
	var m idMemo[int]
	lookups := 0
	table := map[string]int{"a": 1, "b": 2, "c": 3}
	look := func(id string) int { lookups++; return table[id] }
	for _, tc := range []struct {
		ids     []string
		gen     uint64
		want    []int
		lookups int
	}{
		{[]string{"a", "b"}, 1, []int{1, 2}, 2},
		{[]string{"a", "b"}, 1, []int{1, 2}, 0},         // remembered
		{[]string{"b", "a"}, 1, []int{2, 1}, 2},         // same ids, other positions
		{[]string{"b", "c"}, 1, []int{2, 3}, 1},         // one position changed
		{[]string{"b", "c", "a"}, 1, []int{2, 3, 1}, 3}, // another length
		{[]string{"b", "c", "a"}, 2, []int{2, 3, 1}, 3}, // the table changed
	} {
		lookups = 0
		if got := m.resolve(tc.ids, tc.gen, look); !slices.Equal(got, tc.want) || lookups != tc.lookups {
			t.Fatalf("resolve(%v, gen %d) = %v with %d lookups, want %v with %d", tc.ids, tc.gen, got, lookups, tc.want, tc.lookups)
		}
	}
}

// TestEstimateAfterSlotReuse: a node that leaves frees its slot and a new node takes it; an
// estimate asking for the same ids as before must not credit the departed node with the new
// one's blocks, in the index or in the overlay.
func TestEstimateAfterSlotReuse(t *testing.T) {
	chain := chainOf(3, 8)
	x := NewIndex(DefaultIndexConfig())
	o := NewOverlay(0, 0)
	now := time.Unix(100, 0)
	x.ReplaceNode("a", 1, 1, chain)
	x.ReplaceNode("b", 1, 1, chain[:2])
	o.Record("a", chain, now)
	ids := []string{"a", "b"}
	got := make([]int, 2)
	for range 3 { // the same ids, so each estimate may reuse the last one's slots
		x.Estimate(chain, ids, got)
		o.Estimate(chain, ids, got, now)
	}
	if !slices.Equal(got, []int{8, 2}) {
		t.Fatalf("before: %v, want [8 2]", got)
	}
	x.RemoveNode("a")
	o.ForgetNode("a")
	x.ReplaceNode("c", 1, 1, chain[:5]) // takes a's slot
	o.Record("c", chain[:6], now)
	x.Estimate(chain, ids, got)
	o.Estimate(chain, ids, got, now)
	if !slices.Equal(got, []int{0, 2}) {
		t.Fatalf("after a left and c took its slot: %v, want [0 2]", got)
	}
	x.Estimate(chain, []string{"c", "b"}, got)
	o.Estimate(chain, []string{"c", "b"}, got, now)
	if !slices.Equal(got, []int{6, 2}) {
		t.Fatalf("c: %v, want [6 2]", got)
	}
}
