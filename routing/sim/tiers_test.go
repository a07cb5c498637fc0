package sim

import (
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prefixmesh/prefixmesh/local"
	"github.com/prefixmesh/prefixmesh/routing"
)

// tierConfig is smallConfig with a CPU tier twice the GPU pool, small enough to evict.
func tierConfig() Config {
	cfg := smallConfig()
	cfg.CPUBlocks = 2 * cfg.BlocksPerNode
	return cfg
}

// A prompt is served, pushed out of a one-node GPU pool by a longer prompt that takes every
// block (spilling it to the CPU tier) and asked for again: its 62 full blocks come back from the
// CPU, charged at the load rate before the step that prefills the 8 uncached tokens, and count
// as cached (hit ratio, estimate) as vLLM counts its connector's tokens.
func TestCPUTierSpillAndLoad(t *testing.T) {
	tr, err := ReadMooncake(strings.NewReader(
		`{"timestamp": 0, "input_length": 1000, "output_length": 1, "hash_ids": [1, 2]}
{"timestamp": 100000, "input_length": 1008, "output_length": 1, "hash_ids": [3, 4]}
{"timestamp": 200000, "input_length": 1000, "output_length": 1, "hash_ids": [1, 2]}
`), ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Nodes, cfg.Delay = 1, 0
	cfg.BlocksPerNode = 64 // the 1008-token prompt and its output token fill it
	cfg.CPUBlocks = 256
	cfg.PrefillTokensPerSec, cfg.CPULoadTokensPerSec = 10000, 160000
	r, s := run(t, tr, routing.PolicyPrefixMesh, cfg)

	// Each prompt fits one step (kvpool.FromCosts: 18.4 ms + 0.1 ms a token at these rates).
	// Cold (18.4 + 100 ms), cold (18.4 + 100.8 ms), then 992 tokens loaded (6.2 ms) before a
	// step of the 8 uncached (18.4 + 0.8 ms).
	for i, want := range []float64{0.0254, 0.1184, 0.1192} {
		if math.Abs(r.TTFTs[i]-want) > 1e-9 {
			t.Fatalf("TTFTs %v, want 25.4 ms, 118.4 ms and 119.2 ms", r.TTFTs)
		}
	}
	if want := 992.0 / 3008; math.Abs(r.HitRatio-want) > 1e-12 || math.Abs(r.CPUHitRatio-want) > 1e-12 {
		t.Fatalf("hit ratio %v, CPU %v; want both %v", r.HitRatio, r.CPUHitRatio, want)
	}
	if r.EstimateExactShare != 1 {
		t.Fatalf("estimate exact share %v: the router did not see the CPU tier's blocks", r.EstimateExactShare)
	}
	n := s.nodes[0]
	// All 62 of the first prompt's full blocks, and 62 of the second's 63 (its third request
	// needs all but one of the pool's blocks; the second's first block stays on the GPU).
	if st := n.cpu.Stats(); st.Blocks != 124 || st.Stored != 124 || st.Evicted != 0 {
		t.Fatalf("CPU tier %+v, want 62 blocks of each prompt", st)
	}
	if got := n.tree.PeekMatchedTokens(tr.Requests[2].Tokens, cfg.BlockSize, 0); got != 992 {
		t.Fatalf("the loaded blocks are not on the GPU after the insert: %d tokens", got)
	}
	checkIndexes(t, s)
}

// checkIndexes: every router's index holds, for every node, exactly the node's summary: its
// tree's visible blocks and its CPU tier's blocks under their tier keys.
func checkIndexes(t *testing.T, s *Sim) {
	t.Helper()
	for _, n := range s.nodes {
		keys, head := n.sum.snapshot(nil)
		gpu, _ := n.tree.SummarySnapshot(nil)
		var cpu []uint64
		if n.cpu != nil {
			cpu = n.cpu.AppendHashes(nil)
		}
		if len(keys) != len(gpu)+len(cpu) {
			t.Fatalf("%s: summary of %d keys, %d GPU and %d CPU blocks", n.id, len(keys), len(gpu), len(cpu))
		}
		for _, rt := range s.routers {
			_, seq, blocks, ok := rt.index.NodeState(n.id)
			if !ok || seq != head || blocks != len(keys) {
				t.Fatalf("%s at %s: index at %d with %d keys, node at %d with %d", n.id, rt.id, seq, blocks, head, len(keys))
			}
			// With as many keys as the summary, the index holds exactly it if it holds each.
			m := make([]int, 1)
			for _, h := range gpu {
				if rt.index.Estimate([]uint64{h}, []string{n.id}, m); m[0] != 1 {
					t.Fatalf("%s at %s: GPU block %x missing", n.id, rt.id, h)
				}
			}
			for _, h := range cpu {
				if rt.index.EstimateOnTier([]uint64{h}, local.TierCPU, []string{n.id}, m); m[0] != 1 {
					t.Fatalf("%s at %s: CPU block %x missing", n.id, rt.id, h)
				}
			}
		}
	}
}

// After a run with delays, evictions on both tiers and several routers (with and without lost
// deltas, which the routers repair from snapshots of both), every router's index agrees with
// every node's GPU cache and CPU tier; a second run is identical.
func TestCPUTierIndexAgrees(t *testing.T) {
	tr := testTrace(t, 3, 600, 40*time.Millisecond)
	for _, loss := range []float64{0, 0.2} {
		cfg := tierConfig()
		cfg.Routers, cfg.Loss, cfg.Seed = 3, loss, 7
		r, s := run(t, tr, routing.PolicyPrefixMesh, cfg)
		var stored, evicted uint64
		for _, n := range s.nodes {
			st := n.cpu.Stats()
			stored, evicted = stored+st.Stored, evicted+st.Evicted
			if err := n.pool.Check(); err != nil {
				t.Fatal(err)
			}
		}
		if stored == 0 || evicted == 0 || r.CPUHitRatio == 0 {
			t.Fatalf("loss %v: CPU tiers stored %d, evicted %d chunks, CPU hit ratio %v: the test does not exercise the tier",
				loss, stored, evicted, r.CPUHitRatio)
		}
		if loss > 0 && r.Repairs == 0 {
			t.Fatalf("loss %v: no repairs", loss)
		}
		checkIndexes(t, s)
		if again, _ := run(t, tr, routing.PolicyPrefixMesh, cfg); !reflect.DeepEqual(r, again) {
			t.Fatalf("loss %v: a second run differs:\n%+v\n%+v", loss, r, again)
		}
	}
}

// Without a CPU tier the node's summary is its tree's: the same keys at the same sequence
// numbers, so the runs measured before the tier existed are unchanged.
func TestSummaryWithoutTierIsTheTree(t *testing.T) {
	tr := testTrace(t, 5, 200, 50*time.Millisecond)
	_, s := run(t, tr, routing.PolicyPrefixMesh, smallConfig())
	for _, n := range s.nodes {
		keys, head := n.sum.snapshot(nil)
		tree, treeHead := n.tree.SummarySnapshot(nil)
		if head != treeHead || !reflect.DeepEqual(keys, tree) {
			t.Fatalf("%s: summary at %d with %d keys, tree at %d with %d", n.id, head, len(keys), treeHead, len(tree))
		}
	}
}

// With tiers, prefixmesh-gpu (IgnoreTiers) routes by the GPU prefix alone and so differs from
// prefixmesh; without a CPU tier the two are the same run.
func TestPrefixMeshGPUOnly(t *testing.T) {
	tr := testTrace(t, 3, 400, 40*time.Millisecond)
	with, _ := run(t, tr, routing.PolicyPrefixMesh, tierConfig())
	gpuOnly, _ := run(t, tr, routing.PolicyPrefixMeshGPU, tierConfig())
	if gpuOnly.Name != routing.PolicyPrefixMeshGPU || reflect.DeepEqual(with.TTFTs, gpuOnly.TTFTs) {
		t.Fatalf("%s: the same TTFTs as prefixmesh with a CPU tier", gpuOnly.Name)
	}
	with, _ = run(t, tr, routing.PolicyPrefixMesh, smallConfig())
	gpuOnly, _ = run(t, tr, routing.PolicyPrefixMeshGPU, smallConfig())
	gpuOnly.Name = with.Name
	if !reflect.DeepEqual(with, gpuOnly) {
		t.Fatalf("without tiers prefixmesh-gpu differs from prefixmesh:\n%+v\n%+v", with, gpuOnly)
	}
}

func TestCPUTierConfigValidates(t *testing.T) {
	for _, c := range []struct {
		name string
		set  func(*Config)
	}{
		{"negative CPU blocks", func(c *Config) { c.CPUBlocks = -1 }},
		{"CPU blocks not a multiple of the chunk", func(c *Config) { c.CPUBlocks, c.CPUChunkBlocks = 10, 4 }},
		{"no chunk", func(c *Config) { c.CPUBlocks, c.CPUChunkBlocks = 16, 0 }},
		{"no load rate", func(c *Config) { c.CPUBlocks, c.CPULoadTokensPerSec = 16, 0 }},
		{"infinite load rate", func(c *Config) { c.CPUBlocks, c.CPULoadTokensPerSec = 16, math.Inf(1) }},
	} {
		cfg := DefaultConfig()
		c.set(&cfg)
		if err := cfg.Validate(); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	cfg := DefaultConfig()
	cfg.CPUChunkBlocks, cfg.CPULoadTokensPerSec = 0, 0 // unused without a tier
	if err := cfg.Validate(); err != nil {
		t.Errorf("no tier: %v", err)
	}
}
