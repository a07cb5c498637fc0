package routing

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/prefixmesh/prefixmesh/local"
)

// The benchmark fleet: 64 nodes × 100k blocks with realistic sharing. 32 "system prompts" of 256
// blocks are each cached on a quarter of the fleet; conversations extend a system prompt with
// 100–1,000 unique blocks and one in five is also cached on 1–3 other nodes (a session that moved,
// or a hot document). Hashes are random 64-bit values, as xxhash outputs are.
const (
	benchNodes     = 64
	benchBlocks    = 100_000
	benchBlockSize = 16
	benchPrompt    = 8192 // tokens: 512 blocks
)

type benchFleet struct {
	x      *Index
	ids    []string
	prompt []uint64 // 512 hashes: a system prompt + a conversation cached on a few nodes
	bytes  float64  // measured heap bytes per (block, node) pair
}

var (
	benchOnce sync.Once
	fleet     *benchFleet
)

func buildBenchFleet() *benchFleet {
	rng := rand.New(rand.NewPCG(42, 42))
	nodeSets := make([][]uint64, benchNodes)
	var system [][]uint64
	for i := 0; i < 32; i++ {
		c := make([]uint64, 256)
		for j := range c {
			c[j] = rng.Uint64()
		}
		system = append(system, c)
		for n := i % 4; n < benchNodes; n += 4 {
			nodeSets[n] = append(nodeSets[n], c...)
		}
	}
	var prompt []uint64
	for n := 0; n < benchNodes; n++ {
		for len(nodeSets[n]) < benchBlocks {
			sys := system[(n%4)+4*rng.IntN(8)]
			conv := make([]uint64, 100+rng.IntN(900))
			for j := range conv {
				conv[j] = rng.Uint64()
			}
			nodeSets[n] = append(nodeSets[n], conv...)
			if prompt == nil && len(conv) >= 256 {
				prompt = append(append([]uint64(nil), sys...), conv[:256]...)
			}
			if rng.IntN(5) == 0 {
				for k := 1 + rng.IntN(3); k > 0; k-- {
					o := rng.IntN(benchNodes)
					nodeSets[o] = append(nodeSets[o], conv...)
				}
			}
		}
		nodeSets[n] = nodeSets[n][:benchBlocks]
	}
	f := &benchFleet{prompt: prompt}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f.x = NewIndex(IndexConfig{MaxPairs: benchNodes * benchBlocks})
	for n := 0; n < benchNodes; n++ {
		id := fmt.Sprintf("gpu-node-%02d", n)
		f.ids = append(f.ids, id)
		f.x.ReplaceNode(id, 1, 0, nodeSets[n])
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	f.bytes = float64(after.HeapAlloc-before.HeapAlloc) / float64(f.x.Stats().Pairs)
	runtime.KeepAlive(nodeSets)
	return f
}

func getFleet(b *testing.B) *benchFleet {
	b.Helper()
	benchOnce.Do(func() { fleet = buildBenchFleet() })
	return fleet
}

// BenchmarkHashPrompt is the floor Estimate is measured against: hashing the same 8k-token prompt.
func BenchmarkHashPrompt(b *testing.B) {
	tokens := make([]uint32, benchPrompt)
	for i := range tokens {
		tokens[i] = uint32(i * 7919)
	}
	dst := make([]uint64, 0, benchPrompt/benchBlockSize)
	b.SetBytes(benchPrompt * 4)
	b.ReportAllocs()
	for b.Loop() {
		dst = local.AppendBlockHashes(dst[:0], tokens, benchBlockSize, 0)
	}
}

// BenchmarkEstimate: one 512-block prompt against 64 nodes × 100k blocks.
func BenchmarkEstimate(b *testing.B) {
	f := getFleet(b)
	got := make([]int, len(f.ids))
	b.ReportAllocs()
	for b.Loop() {
		f.x.Estimate(f.prompt, f.ids, got)
	}
	maxm := 0
	for _, m := range got {
		maxm = max(maxm, m)
	}
	b.ReportMetric(float64(maxm), "max-matched-blocks")
}

// BenchmarkEstimateParallel: the same, from every core at once (the index's read lock).
func BenchmarkEstimateParallel(b *testing.B) {
	f := getFleet(b)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		got := make([]int, len(f.ids))
		for pb.Next() {
			f.x.Estimate(f.prompt, f.ids, got)
		}
	})
}

// BenchmarkIndexBytesPerPair reports the measured heap per (block, node) pair at 64 × 100k.
func BenchmarkIndexBytesPerPair(b *testing.B) {
	f := getFleet(b)
	st := f.x.Stats()
	for b.Loop() {
	}
	b.ReportMetric(f.bytes, "bytes/pair")
	b.ReportMetric(float64(st.Pairs), "pairs")
	b.ReportMetric(float64(st.DistinctHashes), "distinct-hashes")
	b.ReportMetric(float64(st.ApproxBytes)/float64(st.Pairs), "stats-approx-bytes/pair")
}

// BenchmarkApplyDelta: a 1,300-byte gossip packet's worth of events (~80 changes).
func BenchmarkApplyDelta(b *testing.B) {
	x := NewIndex(DefaultIndexConfig())
	x.ReplaceNode("n", 1, 0, nil)
	ev := make([]Change, 80)
	for i := range ev {
		ev[i] = Change{Hash: uint64(i*2654435761) | 1, Added: i%2 == 0}
	}
	seq := uint64(0)
	b.ReportAllocs()
	for b.Loop() {
		if err := x.ApplyDelta("n", 1, seq, seq+80, ev); err != nil {
			b.Fatal(err)
		}
		seq += 80
	}
}

// BenchmarkOverlayEstimate: a 512-block prompt against an overlay holding 300 recent requests.
func BenchmarkOverlayEstimate(b *testing.B) {
	f := getFleet(b)
	o := NewOverlay(DefaultOverlayTTL, DefaultOverlayMaxEntries)
	now := time.Unix(1000, 0)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 300; i++ {
		hs := make([]uint64, 512)
		copy(hs, f.prompt[:256])
		for j := 256; j < 512; j++ {
			hs[j] = rng.Uint64()
		}
		o.Record(f.ids[rng.IntN(len(f.ids))], hs, now)
	}
	got := make([]int, len(f.ids))
	b.ReportAllocs()
	for b.Loop() {
		clear(got)
		o.Estimate(f.prompt, f.ids, got, now)
	}
}

// BenchmarkChoose: the prefixmesh policy over 64 nodes with estimates from the fleet.
func BenchmarkChoose(b *testing.B) {
	f := getFleet(b)
	p, _ := NewPolicy(PolicyPrefixMesh, DefaultPolicyConfig())
	nodes, matched := benchNodesView(f)
	req := &Request{Hashes: f.prompt, PromptTokens: benchPrompt, BlockSize: benchBlockSize}
	var d Decision
	now := time.Unix(1000, 0)
	b.ReportAllocs()
	for b.Loop() {
		if err := p.Choose(req, nodes, matched, now, &d); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRoute is the router's whole decision path: hash, index, overlay, choose.
func BenchmarkRoute(b *testing.B) {
	f := getFleet(b)
	p, _ := NewPolicy(PolicyPrefixMesh, DefaultPolicyConfig())
	o := NewOverlay(DefaultOverlayTTL, DefaultOverlayMaxEntries)
	nodes, _ := benchNodesView(f)
	blocks := make([]int, len(f.ids))
	matched := make([]int, len(f.ids))
	req := &Request{Hashes: f.prompt, PromptTokens: benchPrompt, BlockSize: benchBlockSize}
	var d Decision
	now := time.Unix(1000, 0)
	b.ReportAllocs()
	for b.Loop() {
		f.x.Estimate(req.Hashes, f.ids, blocks)
		o.Estimate(req.Hashes, f.ids, blocks, now)
		for i, m := range blocks {
			matched[i] = m * benchBlockSize
		}
		if err := p.Choose(req, nodes, matched, now, &d); err != nil {
			b.Fatal(err)
		}
	}
}

func benchNodesView(f *benchFleet) ([]NodeInfo, []int) {
	nodes := make([]NodeInfo, len(f.ids))
	blocks := make([]int, len(f.ids))
	f.x.Estimate(f.prompt, f.ids, blocks)
	matched := make([]int, len(f.ids))
	for i, id := range f.ids {
		nodes[i] = NodeInfo{ID: id, Alive: true, PrefillTokensPerSec: 12000, QueuedPrefillTokens: (i * 977) % 20000,
			Running: i % 9, Waiting: i % 3, InFlight: i % 7, LoadAge: 150 * time.Millisecond, BlockSize: benchBlockSize}
		matched[i] = blocks[i] * benchBlockSize
	}
	return nodes, matched
}

// BenchmarkOverlayBeginEnd: a 512-block request held from routing to its first token (Begin, then
// End, which records it with the TTL) while 300 others wait, each sharing its first half, on 64
// nodes: the overlay's hold counts (holdTable) and pending masks under load.
func BenchmarkOverlayBeginEnd(b *testing.B) {
	o := NewOverlay(DefaultOverlayTTL, DefaultOverlayMaxEntries)
	now := time.Unix(1000, 0)
	rng := rand.New(rand.NewPCG(3, 4))
	prompt := make([]uint64, 512)
	for j := range prompt {
		prompt[j] = rng.Uint64()
	}
	ids := make([]string, benchNodes)
	for i := range ids {
		ids[i] = fmt.Sprintf("gpu-node-%02d", i)
	}
	for i := 0; i < 300; i++ {
		hs := append([]uint64(nil), prompt[:256]...)
		for len(hs) < 512 {
			hs = append(hs, rng.Uint64())
		}
		o.Begin(ids[rng.IntN(len(ids))], hs, now)
	}
	for _, id := range ids { // every node's record of prompt is in place: a steady state
		o.Begin(id, prompt, now)
		o.End(id, prompt, now)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		id := ids[i%len(ids)]
		o.Begin(id, prompt, now)
		o.End(id, prompt, now)
	}
}
