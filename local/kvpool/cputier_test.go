package kvpool

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/prefixmesh/prefixmesh/local"
)

func mustTier(t testing.TB, blocks, chunk, bs int) *CPUTier {
	t.Helper()
	tier, err := NewCPUTier(blocks, chunk, bs)
	if err != nil {
		t.Fatal(err)
	}
	return tier
}

func TestNewCPUTierValidates(t *testing.T) {
	for _, c := range []struct{ blocks, chunk, bs int }{
		{0, 1, 16}, {-4, 1, 16}, {6, 4, 16}, {8, 0, 16}, {8, 4, 0}, {MaxBlocks + 1, 1, 16},
	} {
		if _, err := NewCPUTier(c.blocks, c.chunk, c.bs); !errors.Is(err, ErrInvalid) {
			t.Errorf("NewCPUTier(%d, %d, %d): err %v", c.blocks, c.chunk, c.bs, err)
		}
	}
	tree := local.NewRadixTree(local.Options{})
	tier := mustTier(t, 8, 4, 16)
	for _, c := range []struct {
		tree     *local.RadixTree
		cpu      *CPUTier
		gpu, bs  int
		whatsBad string
	}{
		{nil, tier, 8, 16, "no tree"}, {tree, nil, 8, 16, "no tier"}, {tree, tier, 0, 16, "no GPU blocks"},
		{tree, tier, 8, 32, "another block size"},
	} {
		if _, err := NewSpillCache(c.tree, c.cpu, c.gpu, c.bs); !errors.Is(err, ErrInvalid) {
			t.Errorf("NewSpillCache with %s: err %v", c.whatsBad, err)
		}
	}
}

func TestLoadTime(t *testing.T) {
	c := Costs{PrefillTokensPerSec: 10000, LoadTokensPerSec: 150000}
	for _, tc := range []struct {
		tokens int
		want   time.Duration
	}{{0, 0}, {-16, 0}, {150000, time.Second}, {1500, 10 * time.Millisecond}} {
		if got := c.LoadTime(tc.tokens); got != tc.want {
			t.Errorf("LoadTime(%d) = %v, want %v", tc.tokens, got, tc.want)
		}
	}
	if got := (Costs{}).LoadTime(100); got != 0 {
		t.Errorf("LoadTime at rate 0 = %v, want 0 (free)", got)
	}
}

// The tier against a naive LRU of whole chunks, under random stores, touches and lookups: the
// same chunks held, in the same recency order (AppendHashes), the same continuation for every
// prefix, and the recorded ops replaying the model's stores and evictions.
func TestCPUTierModel(t *testing.T) {
	const bs, chunk, slots = 2, 3, 5
	rng := rand.New(rand.NewPCG(1, 2))
	tier := mustTier(t, slots*chunk, chunk, bs)
	tier.SetRecording(true)
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
	var ops []TierOp
	for step := 0; step < 3000; step++ {
		k := key{rng.IntN(len(chains)), rng.IntN(8)}
		var wantOps []TierOp
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
			} else {
				if len(lru) == slots {
					wantOps = append(wantOps, TierOp{Removed: true, Hashes: hashesOf(lru[slots-1])})
					lru = lru[:slots-1]
				}
				wantOps = append(wantOps, TierOp{Hashes: hs, Tokens: toks, Parent: parent, HasParent: k.idx > 0})
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
			if got := tier.Peek(c, 0, 0); got != want {
				t.Fatalf("step %d: peek %d, want %d", step, got, want)
			}
			if got := tier.Lookup(c, 0, 0); got != want {
				t.Fatalf("step %d: lookup %d, want %d", step, got, want)
			}
			// touch order: every chunk passed, in prompt order, so the last passed is newest
			for b := 0; b < want/bs; b++ {
				i := slices.IndexFunc(lru, func(x key) bool { return slices.Contains(hashesOf(x), all[b]) })
				x := lru[i]
				lru = append(lru[:i], lru[i+1:]...)
				lru = append([]key{x}, lru...)
			}
		}
		// Same chunks, same order, same ops.
		var want []uint64
		for _, k := range lru {
			want = append(want, hashesOf(k)...)
		}
		if got := tier.AppendHashes(nil); !slices.Equal(got, want) || tier.Stats().Blocks != len(want) || len(tier.index) != len(want) {
			t.Fatalf("step %d: tier holds %v (%d indexed), model %v", step, got, len(tier.index), want)
		}
		for _, h := range want {
			if !tier.Holds(h) {
				t.Fatalf("step %d: Holds(%x) false for a held block", step, h)
			}
		}
		ops = tier.Ops(ops[:0])
		if len(ops) != len(wantOps) {
			t.Fatalf("step %d: %d ops, want %d", step, len(ops), len(wantOps))
		}
		for i := range ops {
			g, w := ops[i], wantOps[i]
			if g.Removed != w.Removed || !slices.Equal(g.Hashes, w.Hashes) || !slices.Equal(g.Tokens, w.Tokens) ||
				g.Parent != w.Parent || g.HasParent != w.HasParent {
				t.Fatalf("step %d: op %d is %+v, want %+v", step, i, g, w)
			}
		}
		tier.ResetOps()
	}
	if st := tier.Stats(); st.Stored-st.Evicted != uint64(len(lru)) {
		t.Fatalf("stats %+v with %d chunks held", st, len(lru))
	}
}

// Loadable: a continuation under one chunk is recomputed (vLLM's connector reports no hit under
// offloaded_block_size tokens), one of at least a chunk is loaded whole.
func TestCPUTierLoadable(t *testing.T) {
	tier := mustTier(t, 16, 4, 16)
	for _, c := range []struct{ cont, want int }{{0, 0}, {16, 0}, {63, 0}, {64, 64}, {80, 80}, {128, 128}} {
		if got := tier.Loadable(c.cont); got != c.want {
			t.Errorf("Loadable(%d) = %d, want %d", c.cont, got, c.want)
		}
	}
}

// A pool over a SpillCache: what the GPU evicts lands in the CPU tier in whole chunks (the
// prompt's blocks that fill no chunk, and its partial last block, do not), and a later lookup
// continues the GPU prefix on the CPU.
func TestSpillCacheSpillsEvictedChunks(t *testing.T) {
	const bs, chunk = 4, 2
	tree := local.NewRadixTree(local.Options{})
	tier := mustTier(t, 32, chunk, bs)
	sc, err := NewSpillCache(tree, tier, 12, bs)
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(sc, 12, bs)
	if err != nil {
		t.Fatal(err)
	}
	a := seqTokens(5*bs+1, 1) // 5 full blocks (chunks [0,1] and [2,3]; block 4 in none) and a tail
	runToCache(t, p, a, 0)
	if st := tier.Stats(); st.Blocks != 0 {
		t.Fatalf("CPU tier holds %d blocks before any eviction", st.Blocks)
	}
	runToCache(t, p, seqTokens(12*bs, 1000), 0) // the whole pool: evicts all of a
	if got := tree.PeekMatchedTokens(a, bs, 0); got != 0 {
		t.Fatalf("a still on the GPU: %d tokens", got)
	}
	want := local.BlockHashes(a, bs, 0)[:4]
	got := tier.AppendHashes(nil)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("CPU tier holds %x, want a's two chunks %x", got, want)
	}
	if n := tier.Peek(a, 0, 0); n != 4*bs {
		t.Fatalf("continuation from the root %d, want %d", n, 4*bs)
	}
	if n := tier.Peek(a, 0, 2*bs); n != 2*bs {
		t.Fatalf("continuation after a 2-block GPU prefix %d, want %d", n, 2*bs)
	}
	if sc.Unspillable() != 0 {
		t.Fatalf("%d chunks unspillable", sc.Unspillable())
	}
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
}

// Lookups and the per-insert bookkeeping allocate nothing once warm.
func TestCPUTierAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's instrumentation allocates")
	}
	const bs = 16
	tree := local.NewRadixTree(local.Options{})
	tier := mustTier(t, 64, 1, bs)
	sc, err := NewSpillCache(tree, tier, 64, bs)
	if err != nil {
		t.Fatal(err)
	}
	prompt := seqTokens(40*bs+3, 9)
	tier.SetRecording(true)
	for i := 0; i < 40; i++ {
		tier.Store(local.BlockHashes(prompt, bs, 0)[i:i+1], prompt[i*bs:(i+1)*bs], 0, i > 0, 0)
	}
	ops := tier.Ops(nil)
	table := make([]uint32, 41)
	for i := range table {
		table[i] = uint32(i)
	}
	sc.record(prompt, table, 0) // warm the scratch
	if n := testing.AllocsPerRun(100, func() { tier.Lookup(prompt, 0, 5*bs) }); n != 0 {
		t.Errorf("Lookup: %v allocations", n)
	}
	if n := testing.AllocsPerRun(100, func() { tier.Peek(prompt, 0, 5*bs) }); n != 0 {
		t.Errorf("Peek: %v allocations", n)
	}
	if n := testing.AllocsPerRun(100, func() { sc.record(prompt, table, 0) }); n != 0 {
		t.Errorf("record: %v allocations", n)
	}
	if n := testing.AllocsPerRun(100, func() { ops = tier.Ops(ops[:0]) }); n != 0 {
		t.Errorf("Ops: %v allocations", n)
	}
}
