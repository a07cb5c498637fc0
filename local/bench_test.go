package local

import (
	"math/rand/v2"
	"runtime"
	"testing"
	"time"
)

// The benchmarks behind DESIGN.md, "Measured", for an 8,192-token prompt in 16-token blocks (512
// blocks). The floor is hashing the same tokens (BenchmarkBlockHashes): every tree operation must
// at least hash each block once. Run: go test -run '^$' -bench . -benchmem ./local/

const (
	benchTokens = 8192
	benchBS     = 16
	benchBlocks = benchTokens / benchBS
)

func benchPrompt(seed uint64) []uint32 {
	r := rand.New(rand.NewPCG(seed, 42))
	p := make([]uint32, benchTokens)
	for i := range p {
		p[i] = r.Uint32N(150_000)
	}
	return p
}

func benchTable(base uint32, n int) []uint32 {
	bt := make([]uint32, n)
	for i := range bt {
		bt[i] = base + uint32(i)
	}
	return bt
}

// cachedTree holds one released 8k prompt.
func cachedTree(p []uint32) *RadixTree {
	tr := NewRadixTree(Options{})
	tr.Insert(p, benchTable(0, benchBlocks), nil, benchBS, 0, 0)
	tr.Release(p, benchBS, 0)
	return tr
}

func BenchmarkBlockHashes(b *testing.B) {
	p := benchPrompt(1)
	dst := make([]uint64, 0, benchBlocks)
	b.ReportAllocs()
	for b.Loop() {
		dst = AppendBlockHashes(dst[:0], p, benchBS, 0)
	}
}

func BenchmarkPeek(b *testing.B) {
	p := benchPrompt(1)
	tr := cachedTree(p)
	b.ReportAllocs()
	for b.Loop() {
		if tr.PeekMatchedTokens(p, benchBS, 0) != benchTokens {
			b.Fatal("miss")
		}
	}
}

func BenchmarkLookupRelease(b *testing.B) {
	p := benchPrompt(1)
	tr := cachedTree(p)
	b.ReportAllocs()
	for b.Loop() {
		m := tr.Lookup(p, benchBS, 0, 0)
		tr.ReleaseMatched(p, benchBS, m.MatchedTokens, 0)
	}
}

func BenchmarkLookupIntoRelease(b *testing.B) {
	p := benchPrompt(1)
	tr := cachedTree(p)
	var m PrefixMatch
	b.ReportAllocs()
	for b.Loop() {
		tr.LookupInto(&m, p, benchBS, 0, 0)
		tr.ReleaseMatched(p, benchBS, m.MatchedTokens, 0)
	}
}

// BenchmarkInsertCached inserts a fully cached prompt that the sequence holds from its lookup
// (matched = every token): the walk, the clock stamps and no reported blocks.
func BenchmarkInsertCached(b *testing.B) {
	p := benchPrompt(1)
	tr := cachedTree(p)
	bt := benchTable(0, benchBlocks)
	b.ReportAllocs()
	for b.Loop() {
		tr.Insert(p, bt, nil, benchBS, benchTokens, 0)
	}
}

// BenchmarkInsertHalfCached inserts a prompt whose first half is cached and held: 256 new nodes.
// The release and eviction that restore the tree are not timed.
func BenchmarkInsertHalfCached(b *testing.B) {
	p := benchPrompt(1)
	tr := cachedTree(p[:benchTokens/2])
	q := append(p[:benchTokens/2:benchTokens/2], benchPrompt(2)[benchTokens/2:]...)
	bt := benchTable(0, benchBlocks)
	b.ReportAllocs()
	for b.Loop() {
		tr.Insert(q, bt, nil, benchBS, benchTokens/2, 0)
		b.StopTimer()
		tr.ReleaseMatched(q, benchBS, benchTokens, 0)
		tr.Evict(benchBlocks / 2)
		b.StartTimer()
	}
}

// BenchmarkInsertCold inserts a prompt into an empty tree (node slots and token runs recycled
// from the previous iteration's eviction, as in a warm process): 512 new nodes.
func BenchmarkInsertCold(b *testing.B) {
	p := benchPrompt(1)
	tr := NewRadixTree(Options{})
	bt := benchTable(0, benchBlocks)
	b.ReportAllocs()
	for b.Loop() {
		tr.Insert(p, bt, nil, benchBS, 0, 0)
		b.StopTimer()
		tr.Release(p, benchBS, 0)
		tr.Evict(benchBlocks)
		b.StartTimer()
	}
}

// BenchmarkEvict evicts a released 512-block prompt leaf-first in one call, from a tree that
// also holds 63 other prompts (32k blocks), so the heap is not trivial.
func BenchmarkEvict(b *testing.B) {
	tr := NewRadixTree(Options{})
	for s := uint64(10); s < 73; s++ {
		q := benchPrompt(s)
		tr.Insert(q, benchTable(uint32(s)<<16, benchBlocks), nil, benchBS, 0, 0)
	}
	p := benchPrompt(1)
	bt := benchTable(0, benchBlocks)
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		tr.Insert(p, bt, nil, benchBS, 0, 0)
		tr.Release(p, benchBS, 0)
		b.StartTimer()
		if n := tr.Evict(benchBlocks).Len(); n != benchBlocks {
			b.Fatalf("evicted %d", n)
		}
	}
}

// BenchmarkMemory1M caches 1M distinct 16-token blocks (2,048 prompts of 512 blocks) and reports
// the live heap per cached block, tokens, index, heap, free lists and a full journal included.
func BenchmarkMemory1M(b *testing.B) {
	const prompts = 1 << 20 / benchBlocks
	p := benchPrompt(1)
	bt := benchTable(0, benchBlocks)
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		tr := NewRadixTree(Options{})
		for i := 0; i < prompts; i++ {
			p[0] = uint32(i) // a distinct first block: no sharing
			tr.Insert(p, bt, nil, benchBS, 0, 0)
			tr.Release(p, benchBS, 0)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		if e, _ := tr.Stats(); e != 1<<20 {
			b.Fatalf("cached %d blocks", e)
		}
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(1<<20), "B/block")
		runtime.KeepAlive(tr)
	}
}

// BenchmarkRatio reports each operation's cost as a multiple of the floor (hashing the same
// prompt), timing the floor and the operation alternately in the same loop so that machine load
// affects both alike. The x-floor metric is the figure DESIGN.md, "Measured", reports.
func BenchmarkRatio(b *testing.B) {
	p := benchPrompt(1)
	half := append(p[:benchTokens/2:benchTokens/2], benchPrompt(2)[benchTokens/2:]...)
	bt := benchTable(0, benchBlocks)
	var m PrefixMatch
	dst := make([]uint64, 0, benchBlocks)
	cases := []struct {
		name  string
		setup func() *RadixTree
		op    func(tr *RadixTree)
		reset func(tr *RadixTree) // untimed
	}{
		{"peek", func() *RadixTree { return cachedTree(p) }, func(tr *RadixTree) { tr.PeekMatchedTokens(p, benchBS, 0) }, nil},
		{"lookup+release", func() *RadixTree { return cachedTree(p) }, func(tr *RadixTree) {
			m := tr.Lookup(p, benchBS, 0, 0)
			tr.ReleaseMatched(p, benchBS, m.MatchedTokens, 0)
		}, nil},
		{"lookupinto+release", func() *RadixTree { return cachedTree(p) }, func(tr *RadixTree) {
			tr.LookupInto(&m, p, benchBS, 0, 0)
			tr.ReleaseMatched(p, benchBS, m.MatchedTokens, 0)
		}, nil},
		{"insert-cached", func() *RadixTree { return cachedTree(p) }, func(tr *RadixTree) {
			tr.Insert(p, bt, nil, benchBS, benchTokens, 0)
		}, nil},
		{"insert-halfcached", func() *RadixTree { return cachedTree(p[:benchTokens/2]) }, func(tr *RadixTree) {
			tr.Insert(half, bt, nil, benchBS, benchTokens/2, 0)
		}, func(tr *RadixTree) {
			tr.ReleaseMatched(half, benchBS, benchTokens, 0)
			tr.Evict(benchBlocks / 2)
			tr.PeekMatchedTokens(p, benchBS, 0) // a different path hint, as after another sequence
		}},
		{"insert-cold", func() *RadixTree { return NewRadixTree(Options{}) }, func(tr *RadixTree) {
			tr.Insert(p, bt, nil, benchBS, 0, 0)
		}, func(tr *RadixTree) {
			tr.Release(p, benchBS, 0)
			tr.Evict(benchBlocks)
		}},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			tr := c.setup()
			var floor, op time.Duration
			b.ReportAllocs()
			for b.Loop() {
				t0 := time.Now()
				dst = AppendBlockHashes(dst[:0], p, benchBS, 0)
				t1 := time.Now()
				c.op(tr)
				t2 := time.Now()
				floor += t1.Sub(t0)
				op += t2.Sub(t1)
				if c.reset != nil {
					b.StopTimer()
					c.reset(tr)
					b.StartTimer()
				}
			}
			b.ReportMetric(float64(op)/float64(floor), "x-floor")
			b.ReportMetric(float64(op.Nanoseconds())/float64(b.N), "op-ns")
		})
	}
}
