package routing

import (
	"fmt"
	"testing"
)

// TestRendezvous: the weight is a pure function (fixed vectors pin it across releases, since two
// router versions in one cluster must agree), keys spread evenly, and removing a node only moves
// the keys it won.
func TestRendezvous(t *testing.T) {
	for _, v := range []struct {
		key  uint64
		id   string
		want uint64
	}{{0x0123456789abcdef, "gpu-node-07", 0x395d449b9f3d533c}, {0, "", 0x8932c885a3fe960e}} {
		if w := RendezvousWeight(v.key, v.id); w != v.want {
			t.Fatalf("weight(%#x, %q) = %#x, want %#x", v.key, v.id, w, v.want)
		}
	}
	ids := make([]string, 10)
	for i := range ids {
		ids[i] = fmt.Sprintf("node-%d", i)
	}
	const keys = 20000
	counts := make([]int, len(ids))
	moved := 0
	for k := uint64(0); k < keys; k++ {
		key := mix64(k + 1)
		i := RendezvousPick(key, ids)
		counts[i]++
		j := RendezvousPick(key, ids[:9]) // node-9 removed
		if i != 9 && j != i {
			moved++
		}
	}
	for i, c := range counts {
		if c < keys/10*8/10 || c > keys/10*12/10 {
			t.Fatalf("node %d won %d of %d keys", i, c, keys)
		}
	}
	if moved != 0 {
		t.Fatalf("%d keys moved between surviving nodes", moved)
	}
	if RendezvousPick(1, nil) != -1 {
		t.Fatal("empty pick")
	}
}
