package routing

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"

	"github.com/prefixmesh/prefixmesh/local"
)

// The tiered benchmark fleet: the benchmark fleet's sharing (buildBenchFleet) with 150k blocks
// per node, of which the GPU holds the first 100k and the CPU tier the last 100k (50k on both, as
// an offloading connector keeps copies of what the GPU still holds, 50k only on the CPU): 200k
// (key, node) pairs per node, 12.8M in all. The prompt is a system prompt and 256 blocks of a
// conversation; the conversation's second half is moved to the CPU on every node holding it, so
// lookups walk the lower tiers.
type tierFleet struct {
	x      *Index
	ids    []string
	prompt []uint32 // 8k tokens whose hashes are the prompt's chain
	hashes []uint64
	bytes  float64
}

var (
	tierOnce  sync.Once
	tierBench *tierFleet
)

func buildTierFleet() *tierFleet {
	const gpuBlocks, cpuFrom, total = 100_000, 50_000, 150_000
	rng := rand.New(rand.NewPCG(7, 7))
	// The prompt's tokens and chain come first, so the fleet can hold its real hashes.
	tokens := make([]uint32, benchPrompt)
	for i := range tokens {
		tokens[i] = rng.Uint32()
	}
	chain := local.AppendBlockHashes(nil, tokens, benchBlockSize, 0)
	sys, conv := chain[:256], chain[256:]
	nodeSets := make([][]uint64, benchNodes)
	for i := 0; i < 32; i++ { // the benchmark fleet's 32 system prompts, each on a quarter of it
		c := make([]uint64, 256)
		for j := range c {
			c[j] = rng.Uint64()
		}
		for n := i % 4; n < benchNodes; n += 4 {
			nodeSets[n] = append(nodeSets[n], c...)
		}
	}
	cpuOnly := make([]map[uint64]bool, benchNodes)
	for n := range nodeSets {
		cpuOnly[n] = map[uint64]bool{}
		if n%4 == 0 { // a quarter of the fleet holds the system prompt on the GPU
			nodeSets[n] = append(nodeSets[n], sys...)
		}
		if n%16 == 0 { // four nodes hold the conversation, its second half only on the CPU
			nodeSets[n] = append(nodeSets[n], conv[:128]...)
			for _, h := range conv[128:] {
				cpuOnly[n][h] = true
			}
		}
		for len(nodeSets[n]) < total {
			c := make([]uint64, 100+rng.IntN(900))
			for j := range c {
				c[j] = rng.Uint64()
			}
			nodeSets[n] = append(nodeSets[n], c...)
			if rng.IntN(5) == 0 {
				for k := 1 + rng.IntN(3); k > 0; k-- {
					o := rng.IntN(benchNodes)
					nodeSets[o] = append(nodeSets[o], c...)
				}
			}
		}
		nodeSets[n] = nodeSets[n][:total]
	}
	keys := make([][]uint64, benchNodes)
	for n, set := range nodeSets {
		k := append([]uint64(nil), set[:gpuBlocks]...)
		for _, h := range set[cpuFrom:] {
			k = append(k, local.TierKey(h, local.TierCPU))
		}
		for h := range cpuOnly[n] {
			k = append(k, local.TierKey(h, local.TierCPU))
		}
		keys[n] = k
	}
	f := &tierFleet{prompt: tokens, hashes: chain}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f.x = NewIndex(IndexConfig{MaxPairs: benchNodes * (total + 2*gpuBlocks)})
	for n := range keys {
		id := fmt.Sprintf("gpu-node-%02d", n)
		f.ids = append(f.ids, id)
		f.x.ReplaceNode(id, 1, 0, keys[n])
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	f.bytes = float64(after.HeapAlloc-before.HeapAlloc) / float64(f.x.Stats().Pairs)
	runtime.KeepAlive(keys)
	return f
}

func getTierFleet(b *testing.B) *tierFleet {
	b.Helper()
	tierOnce.Do(func() { tierBench = buildTierFleet() })
	return tierBench
}

// BenchmarkIndexBytesPerPairTiers: heap per (key, node) pair with a CPU tier beside the GPU.
func BenchmarkIndexBytesPerPairTiers(b *testing.B) {
	f := getTierFleet(b)
	st := f.x.Stats()
	for b.Loop() {
	}
	b.ReportMetric(f.bytes, "bytes/pair")
	b.ReportMetric(float64(st.Pairs), "pairs")
}

// BenchmarkDirectoryLookup is what a directory query (router/directory's Lookup) costs past
// parsing: hash an 8k-token prompt, the GPU estimate over 64 nodes, the lower tiers' continuation
// and each lower tier's own prefix. Compare with
// BenchmarkHashPrompt (the hashing alone).
func BenchmarkDirectoryLookup(b *testing.B) {
	f := getTierFleet(b)
	gpu := make([]int, len(f.ids))
	lower := make([]TierTokens, len(f.ids))
	alone := make([]int, len(f.ids))
	hashes := make([]uint64, 0, len(f.hashes))
	b.ReportAllocs()
	for b.Loop() {
		hashes = local.AppendBlockHashes(hashes[:0], f.prompt, benchBlockSize, 0)
		f.x.Estimate(hashes, f.ids, gpu)
		f.x.ContinueLower(hashes, f.ids, gpu, benchBlockSize, lower)
		for t := local.TierGPU + 1; t < local.NumTiers; t++ { // each tier's own prefix, as the directory reports it
			f.x.EstimateOnTier(hashes, t, f.ids, alone)
		}
	}
	best, cpu := 0, 0
	for i := range gpu {
		best = max(best, gpu[i])
		cpu = max(cpu, lower[i][local.TierCPU])
	}
	if best != 384 || cpu != 128*benchBlockSize {
		b.Fatalf("GPU best %d blocks, CPU best %d tokens; the fleet holds 384 and %d", best, cpu, 128*benchBlockSize)
	}
}

// BenchmarkContinueLower: the lower tiers' walk alone, after the GPU estimate.
func BenchmarkContinueLower(b *testing.B) {
	f := getTierFleet(b)
	gpu := make([]int, len(f.ids))
	lower := make([]TierTokens, len(f.ids))
	f.x.Estimate(f.hashes, f.ids, gpu)
	b.ReportAllocs()
	for b.Loop() {
		f.x.ContinueLower(f.hashes, f.ids, gpu, benchBlockSize, lower)
	}
}

// BenchmarkEstimateTiers: the GPU estimate alone on the tiered fleet.
func BenchmarkEstimateTiers(b *testing.B) {
	f := getTierFleet(b)
	gpu := make([]int, len(f.ids))
	b.ReportAllocs()
	for b.Loop() {
		f.x.Estimate(f.hashes, f.ids, gpu)
	}
}
