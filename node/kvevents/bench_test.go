package kvevents

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/prefixmesh/prefixmesh/local"
)

// benchBatch is one engine step of a busy engine: 32 prompts prefilled, each a BlockStored of 32
// new 16-token blocks chained under a shared 4-block system prompt, and 32 single-block
// evictions; store and remove alternate over the same hashes so the mirror stays in steady
// state across iterations.
func benchBatches(layout Layout, hashes HashFormat) (store, remove []byte, blocks int) {
	const prompts, perPrompt, bs = 32, 32, 16
	e := NewEncoder(layout, hashes)
	var evs []Event
	var rem []Event
	for p := 0; p < prompts; p++ {
		ev := Event{Kind: KindStored, BlockSize: bs, Parent: 1, HasParent: true}
		for b := 0; b < perPrompt; b++ {
			h := uint64(p)<<32 | uint64(b) | 1<<63
			ev.Hashes = append(ev.Hashes, h)
			for t := 0; t < bs; t++ {
				ev.Tokens = append(ev.Tokens, uint32(p*100000+b*bs+t))
			}
		}
		evs = append(evs, ev)
		for b := perPrompt - 1; b >= 0; b-- { // leaves first, as an engine evicts
			rem = append(rem, Event{Kind: KindRemoved, Hashes: []uint64{uint64(p)<<32 | uint64(b) | 1<<63}})
		}
	}
	store = append([]byte(nil), e.Encode(1, evs, 0)...)
	remove = append([]byte(nil), e.Encode(2, rem, 0)...)
	return store, remove, prompts * perPrompt
}

func rootBlock(m *CacheMirror) {
	m.Apply(0, &Event{Kind: KindStored, Hashes: []uint64{1}, Tokens: make([]uint32, 16), BlockSize: 16})
}

// BenchmarkDecodeApply: blocks decoded and applied per second on one core (store and removal
// events alternate, so each block is decoded and applied twice per iteration). The baseline in
// the same run is decoding the same bytes generically (msgpack.Unmarshal into any, the way Go
// consumers such as llm-d's decode before walking the result), without applying anything.
func BenchmarkDecodeApply(b *testing.B) {
	for _, c := range []struct {
		name   string
		layout Layout
		hashes HashFormat
	}{{"map-int", LayoutMap, HashInt}, {"array-int", LayoutArray, HashInt}, {"map-bytes", LayoutMap, HashBytes}} {
		store, remove, blocks := benchBatches(c.layout, c.hashes)
		b.Run(c.name+"/decode+apply", func(b *testing.B) {
			d := NewDecoder()
			m := NewCacheMirror(16)
			rootBlock(m)
			run := func(i int) {
				for _, p := range [][]byte{store, remove} {
					bt, err := d.Decode(uint64(i), p)
					if err != nil {
						b.Fatal(err)
					}
					for j := range bt.Events {
						m.Apply(0, &bt.Events[j])
					}
				}
			}
			for i := 0; i < 64; i++ { // warm-up: the journal ring and the maps reach their size
				run(i)
			}
			b.ReportAllocs()
			b.SetBytes(int64(len(store) + len(remove)))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				run(i)
			}
			b.ReportMetric(float64(2*blocks*b.N)/b.Elapsed().Seconds(), "blocks/s")
		})
		b.Run(c.name+"/baseline-generic-unmarshal", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(store) + len(remove)))
			for i := 0; i < b.N; i++ {
				for _, p := range [][]byte{store, remove} {
					var v any
					if err := msgpack.Unmarshal(p, &v); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(2*blocks*b.N)/b.Elapsed().Seconds(), "blocks/s")
		})
	}
}

// BenchmarkMirrorMemory reports the heap held per mirrored block at 1M blocks (chains of 64
// 16-token blocks), against a local.RadixTree holding the same blocks in the same run.
func BenchmarkMirrorMemory(b *testing.B) {
	const chains, per, bs = 1 << 14, 64, 16
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	for i := 0; i < b.N; i++ {
		before := heap()
		m := NewCacheMirror(bs)
		ev := Event{Kind: KindStored, BlockSize: bs}
		for c := 0; c < chains; c++ {
			ev.Hashes, ev.Tokens = ev.Hashes[:0], ev.Tokens[:0]
			for k := 0; k < per; k++ {
				ev.Hashes = append(ev.Hashes, uint64(c)<<20|uint64(k))
				for t := 0; t < bs; t++ {
					ev.Tokens = append(ev.Tokens, uint32(c*per*bs+k*bs+t))
				}
			}
			m.Apply(0, &ev)
		}
		after := heap()
		if s := m.MirrorStats(); s.Blocks != chains*per || s.Visible != chains*per {
			b.Fatalf("mirror holds %d blocks, %d visible", s.Blocks, s.Visible)
		}
		b.ReportMetric(float64(after-before)/float64(chains*per), "B/block")
		runtime.KeepAlive(m)

		before = heap()
		tree := local.NewRadixTree(local.Options{})
		tokens := make([]uint32, per*bs)
		table := make([]uint32, per)
		for c := 0; c < chains; c++ {
			for j := range tokens {
				tokens[j] = uint32(c*per*bs + j)
			}
			for j := range table {
				table[j] = uint32(c*per + j)
			}
			tree.Insert(tokens, table, nil, bs, 0, 0)
		}
		after = heap()
		b.ReportMetric(float64(after-before)/float64(chains*per), "baseline-radixtree-B/block")
		runtime.KeepAlive(tree)
	}
}

// BenchmarkPeek: a router-style peek of a 2,048-token prompt against a mirror holding it.
func BenchmarkPeek(b *testing.B) {
	m := NewCacheMirror(16)
	toks := make([]uint32, 2048)
	for i := range toks {
		toks[i] = uint32(i)
	}
	hs := make([]uint64, 128)
	for i := range hs {
		hs[i] = uint64(i + 1)
	}
	m.Apply(0, &Event{Kind: KindStored, Hashes: hs, Tokens: toks, BlockSize: 16})
	b.Run("mirror", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			if m.PeekMatchedTokens(toks, 16, 0) != 2048 {
				b.Fatal("peek")
			}
		}
	})
	b.Run("baseline-hash-only", func(b *testing.B) {
		dst := make([]uint64, 0, 128)
		for i := 0; i < b.N; i++ {
			dst = local.AppendBlockHashes(dst[:0], toks, 16, 0)
		}
		_ = fmt.Sprint(len(dst))
	})
}

// BenchmarkFollowerLive: the follower's in-order live path (rank machine, decode, apply, metrics,
// position, idle timer) over one removal and one store batch per iteration, without sockets.
func BenchmarkFollowerLive(b *testing.B) {
	live, store, remove := followerHotPath(b)
	seq := uint64(0)
	for range 64 {
		for _, p := range [][]byte{remove, store} {
			seq++
			live(seq, p)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, p := range [][]byte{remove, store} {
			seq++
			live(seq, p)
		}
	}
}

// cpuBenchBatches is the benchmark's engine step offloaded to the CPU the way vLLM's
// self-describing offload events describe it (vllm/distributed/kv_transfer/kv_connector/v1/
// offloading/events.py): each prompt's 32 GPU blocks as two 256-token CPU chunks of 16
// per-block hashes, then each chunk's removal fanned out to its 16 hashes. gpu stores the GPU
// blocks the chunks lie over (applied once, before the benchmark).
func cpuBenchBatches() (gpu, store, remove []byte, blocks int) {
	const prompts, perPrompt, bs, perChunk = 32, 32, 16, 16
	e := NewEncoder(LayoutMap, HashInt)
	var gpus, stores, rems []Event
	for p := 0; p < prompts; p++ {
		hash := func(b int) uint64 { return uint64(p)<<32 | uint64(b) | 1<<63 }
		tok := func(b, t int) uint32 { return uint32(p*100000 + b*bs + t) }
		g := Event{Kind: KindStored, BlockSize: bs, Parent: 1, HasParent: true}
		for b := 0; b < perPrompt; b++ {
			g.Hashes = append(g.Hashes, hash(b))
			for t := 0; t < bs; t++ {
				g.Tokens = append(g.Tokens, tok(b, t))
			}
		}
		gpus = append(gpus, g)
		for c := 0; c < perPrompt; c += perChunk {
			ev := Event{Kind: KindStored, BlockSize: bs, Parent: 1, HasParent: true, Tier: TierCPU}
			if c > 0 {
				ev.Parent = hash(c - 1)
			}
			rem := Event{Kind: KindRemoved, Tier: TierCPU}
			for b := c; b < c+perChunk; b++ {
				ev.Hashes = append(ev.Hashes, hash(b))
				rem.Hashes = append(rem.Hashes, hash(b))
				for t := 0; t < bs; t++ {
					ev.Tokens = append(ev.Tokens, tok(b, t))
				}
			}
			stores = append(stores, ev)
			rems = append(rems, rem)
		}
	}
	gpu = append([]byte(nil), e.Encode(1, gpus, 0)...)
	store = append([]byte(nil), e.Encode(2, stores, 0)...)
	remove = append([]byte(nil), e.Encode(3, rems, 0)...)
	return gpu, store, remove, prompts * perPrompt
}

// tierBenchRun returns one iteration of decoding and applying a store and a removal batch, with
// the follower's Expire after each, against a mirror prepared by setup.
func tierBenchRun(t testing.TB, d *Decoder, m *CacheMirror, store, remove []byte) func() {
	seq := uint64(10)
	return func() {
		for _, p := range [][]byte{store, remove} {
			if p == nil {
				continue
			}
			seq++
			bt, err := d.Decode(seq, p)
			if err != nil {
				t.Fatal(err)
			}
			for j := range bt.Events {
				m.Apply(0, &bt.Events[j])
			}
			m.Expire()
		}
	}
}

// BenchmarkDecodeApplyTiers: blocks/s decoded and applied for vLLM's self-describing CPU offload
// events (CPU copies added to blocks held on the GPU, then removed), with the GPU store and
// eviction of the same blocks as the baseline in the same run (BenchmarkDecodeApply's step).
func BenchmarkDecodeApplyTiers(b *testing.B) {
	gpuStore, gpuRemove, blocks := benchBatches(LayoutMap, HashInt)
	gpu, cpuStore, cpuRemove, cpuBlocks := cpuBenchBatches()
	for _, c := range []struct {
		name          string
		store, remove []byte
		blocks        int
		pre           []byte
	}{{"gpu-baseline", gpuStore, gpuRemove, blocks, nil}, {"cpu-self-describing", cpuStore, cpuRemove, cpuBlocks, gpu}} {
		b.Run(c.name, func(b *testing.B) {
			d := NewDecoder()
			m := NewCacheMirror(16)
			rootBlock(m)
			if c.pre != nil {
				tierBenchRun(b, d, m, c.pre, nil)()
			}
			run := tierBenchRun(b, d, m, c.store, c.remove)
			for range 64 {
				run()
			}
			b.ReportAllocs()
			b.SetBytes(int64(len(c.store) + len(c.remove)))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				run()
			}
			b.ReportMetric(float64(2*c.blocks*b.N)/b.Elapsed().Seconds(), "blocks/s")
		})
	}
}

// BenchmarkPeekByTier: the per-tier peek of a 2,048-token prompt, half on the GPU and all on the
// CPU, beside BenchmarkPeek's GPU-only peek of the same prompt.
func BenchmarkPeekByTier(b *testing.B) {
	m, toks := peekByTierMirror()
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if got := m.PeekMatchedTokensByTier(toks, 16, 0); got[TierGPU] != 1024 || got[TierCPU] != 1024 {
			b.Fatal(got)
		}
	}
}
