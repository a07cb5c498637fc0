package kvpool

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/prefixmesh/prefixmesh/local"
)

// The tier against a naive LRU of whole chunks, under random stores, touches and lookups: the
// same chunks held, in the same recency order, and the same continuation for every prefix.
func TestCPUTierModel(t *testing.T) {
	const bs, chunk, slots = 2, 3, 5
	rng := rand.New(rand.NewPCG(1, 2))
	tier := NewCPUTier(slots*chunk, chunk, bs)
	tier.Record = true
	// A few chains; a chunk is named by (chain, index).
	chains := make([][]uint32, 4)
	for i := range chains {
		chains[i] = make([]uint32, 8*chunk*bs)
		for j := range chains[i] {
			chains[i][j] = uint32(rng.IntN(3)) // small alphabet: chains share prefixes
		}
	}
	type key struct{ chain, idx int }
	var lru []key // most recent first
	hashesOf := func(k key) []uint64 {
		return local.BlockHashes(chains[k.chain], bs, 0)[k.idx*chunk : (k.idx+1)*chunk]
	}
	same := func(a, b key) bool { return slices.Equal(hashesOf(a), hashesOf(b)) }
	for step := 0; step < 3000; step++ {
		k := key{rng.IntN(len(chains)), rng.IntN(8)}
		switch rng.IntN(3) {
		case 0, 1: // store
			hs := hashesOf(k)
			toks := chains[k.chain][k.idx*chunk*bs : (k.idx+1)*chunk*bs]
			var parent uint64
			if k.idx > 0 {
				parent = local.BlockHashes(chains[k.chain], bs, 0)[k.idx*chunk-1]
			}
			tier.Store(hs, toks, parent, k.idx > 0, 0)
			i := slices.IndexFunc(lru, func(x key) bool { return same(x, k) })
			if i >= 0 {
				lru = append(lru[:i], lru[i+1:]...)
			} else if len(lru) == slots {
				lru = lru[:slots-1]
			}
			lru = append([]key{k}, lru...)
		case 2: // lookup from the root, touching
			c := chains[k.chain]
			want := 0
			all := local.BlockHashes(c, bs, 0)
			for b := range all {
				if !slices.ContainsFunc(lru, func(x key) bool { return slices.Contains(hashesOf(x), all[b]) }) {
					break
				}
				want += bs
			}
			if got := tier.Continuation(c, 0, 0, true); got != want {
				t.Fatalf("step %d: continuation %d, want %d", step, got, want)
			}
			// touch order: every chunk passed, in prompt order, so the last passed is newest
			for b := 0; b < want/bs; b++ {
				i := slices.IndexFunc(lru, func(x key) bool { return slices.Contains(hashesOf(x), all[b]) })
				x := lru[i]
				lru = append(lru[:i], lru[i+1:]...)
				lru = append([]key{x}, lru...)
			}
		}
		// Same chunks, same order.
		var got [][]uint64
		for s := tier.head; s != noSlot; s = tier.next[s] {
			got = append(got, tier.hashes[int(s)*chunk:(int(s)+1)*chunk])
		}
		if len(got) != len(lru) || tier.Blocks() != len(lru)*chunk || len(tier.index) != len(lru)*chunk {
			t.Fatalf("step %d: tier holds %d chunks (%d indexed blocks), model %d", step, len(got), len(tier.index), len(lru))
		}
		for i, k := range lru {
			if !slices.Equal(got[i], hashesOf(k)) {
				t.Fatalf("step %d: recency position %d differs", step, i)
			}
		}
		tier.ResetOps()
	}
}

// Lookups and the per-insert bookkeeping allocate nothing once warm.
func TestCPUTierAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's instrumentation allocates")
	}
	const bs = 16
	tree := local.NewRadixTree(local.Options{})
	tier := NewCPUTier(64, 1, bs)
	sc := NewSpillCache(tree, tier, 64, bs)
	prompt := seqTokens(40*bs+3, 9)
	for i := 0; i < 40; i++ {
		tier.Store(local.BlockHashes(prompt, bs, 0)[i:i+1], prompt[i*bs:(i+1)*bs], 0, i > 0, 0)
	}
	table := make([]uint32, 41)
	for i := range table {
		table[i] = uint32(i)
	}
	sc.record(prompt, table, 0) // warm the scratch
	if n := testing.AllocsPerRun(100, func() { tier.Continuation(prompt, 0, 5*bs, true) }); n != 0 {
		t.Errorf("continuation: %v allocations", n)
	}
	if n := testing.AllocsPerRun(100, func() { sc.record(prompt, table, 0) }); n != 0 {
		t.Errorf("record: %v allocations", n)
	}
}
