package local

import (
	"math/rand/v2"
	"testing"
	"time"
)

// BenchmarkLookupTiered measures the serving lookup over 1,000 entries and an 8k-token prompt
// fully matched by the tree: 128 anchors lie on the prompt (every 64 tokens), the other 872 on
// other conversations at random depths. "naive" is the reference's algorithm (every candidate's
// key hashed from scratch, refIndex in the model test) on the same entries: the baseline.
// "hash-floor" hashes the prompt once, which any lookup that can return the 8k-deep anchor must
// do: FNV is a serial chain of multiplies, so that is the floor.
func BenchmarkLookupTiered(b *testing.B) {
	const entries, promptLen, anchorEvery = 1000, 8192, 64
	r := rand.New(rand.NewPCG(1, 2))
	prompt := make([]uint32, promptLen)
	for i := range prompt {
		prompt[i] = r.Uint32N(150_000)
	}
	x := newSnapshotIndex(Options{})
	ref := newRefIndex(Options{})
	add := func(key uint64, slot int, session uint64, depth int) {
		x.insert(key, slot, session, depth)
		ref.upsert(key, slot, session, depth, snapPlain)
	}
	slot := 0
	for d := anchorEvery; d <= promptLen; d += anchorEvery {
		slot++
		add(prefixHash(prompt, d, 0), slot, uint64(slot%8), d)
	}
	other := make([]uint32, promptLen)
	for slot < entries {
		for i := range other {
			other[i] = r.Uint32N(150_000)
		}
		slot++
		add(prefixHash(other, 1+r.IntN(promptLen), 0), slot, uint64(slot%8), 1+r.IntN(promptLen))
	}
	want := prefixHash(prompt, promptLen, 0)
	b.Run("index", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			m, ok := x.lookupTiered(prompt, promptLen, 3, 0)
			if !ok || m.tokenCount != promptLen {
				b.Fatalf("lookup = %+v %v", m, ok)
			}
		}
	})
	b.Run("hash-floor", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if prefixHash(prompt, promptLen, 0) != want {
				b.Fatal("hash")
			}
		}
	})
	// ratio times the floor and the lookup alternately in one loop, so that load on a shared
	// machine affects both alike, and reports lookup time / floor time.
	b.Run("ratio", func(b *testing.B) {
		var floor, index time.Duration
		for b.Loop() {
			t0 := time.Now()
			h := prefixHash(prompt, promptLen, 0)
			t1 := time.Now()
			m, ok := x.lookupTiered(prompt, promptLen, 3, 0)
			t2 := time.Now()
			if h != want || !ok || m.tokenCount != promptLen {
				b.Fatal("ratio lookup")
			}
			floor, index = floor+t1.Sub(t0), index+t2.Sub(t1)
		}
		b.ReportMetric(float64(index)/float64(floor), "x-floor")
	})
	b.Run("naive", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if i := ref.lookup(prompt, promptLen, 3, 0, false); i < 0 || ref.entries[i].key != want {
				b.Fatal("naive lookup missed")
			}
		}
	})
}

// BenchmarkEvictLRU measures victim choice over 1,000 entries in 8 sessions (each iteration
// evicts one entry and registers a fresh one, so the size stays at 1,000).
func BenchmarkEvictLRU(b *testing.B) {
	x := newSnapshotIndex(Options{})
	for i := range 1000 {
		x.insert(uint64(i), i, uint64(i%8), i)
	}
	next := 1000
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := x.evictLRU(); !ok {
			b.Fatal("no victim")
		}
		x.insert(uint64(next), next, uint64(next%8), next%5000)
		next++
	}
}
