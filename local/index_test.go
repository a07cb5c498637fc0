package local

import (
	"math/rand/v2"
	"testing"
	"unsafe"
)

// TestHashIndex checks the open-addressing table against a map under random puts and deletes,
// with hashes drawn from a few clustered values so probe runs wrap and backward shifts happen.
func TestHashIndex(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	nodes := make([]node, 4096)
	var x hashIndex
	ref := map[uint64]int32{}
	var free []int32
	for i := range nodes {
		free = append(free, int32(i))
	}
	for step := 0; step < 50_000; step++ {
		h := uint64(r.IntN(64))<<40 | uint64(r.IntN(8)) | uint64(r.IntN(3))*(1<<20-3)
		if c, ok := ref[h]; ok {
			if x.get(nodes, h) != c {
				t.Fatalf("step %d: get(%x) = %d, want %d", step, h, x.get(nodes, h), c)
			}
			if r.IntN(2) == 0 {
				x.del(nodes, h)
				delete(ref, h)
				free = append(free, c)
			}
		} else {
			if x.get(nodes, h) != noNode {
				t.Fatalf("step %d: phantom %x", step, h)
			}
			c := free[len(free)-1]
			free = free[:len(free)-1]
			nodes[c].hash = h
			x.put(nodes, c)
			ref[h] = c
		}
		if x.len() != len(ref) {
			t.Fatalf("len %d, want %d", x.len(), len(ref))
		}
	}
	for h, c := range ref {
		if x.get(nodes, h) != c {
			t.Fatalf("final get(%x)", h)
		}
	}
}

// TestNodeSize pins the 64-byte node the memory budget (≤ 256 B per block with its tokens)
// relies on; BenchmarkMemory1M measures the whole.
func TestNodeSize(t *testing.T) {
	if n := unsafe.Sizeof(node{}); n != 64 {
		t.Fatalf("node is %d bytes, want 64", n)
	}
}
