package simengine

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/prefixmesh/prefixmesh/node/kvevents"
)

// The engine's CPU tier, as its events describe it, mirrored by the node agent's real follower
// over ZMQ: after a workload with shared prefixes and adapters that spills GPU evictions to the
// CPU and makes the CPU evict, the mirror holds per tier what the engine holds (its copies per
// tier, and for every prompt the GPU prefix and how far the CPU continues it). Chunks of one
// block and of four.
func TestKVEventsCPUTierMirror(t *testing.T) {
	for _, chunk := range []int{1, 4} {
		t.Run(fmt.Sprintf("chunk%d", chunk), func(t *testing.T) {
			cfg := fastConfig()
			cfg.KVBlocks = 96 // the workload needs several times this
			cfg.CPUBlocks, cfg.CPUChunkBlocks = 64, chunk
			cfg.KVEvents.Endpoint, cfg.KVEvents.Replay = "tcp://127.0.0.1:0", "tcp://127.0.0.1:0"
			cfg.KVEvents.Layout, cfg.KVEvents.Hashes = kvevents.LayoutMap, kvevents.HashInt
			te := startEngine(t, cfg)

			mir := kvevents.NewCacheMirror(cfg.BlockSize)
			fc := kvevents.DefaultConfig()
			fc.Endpoint, fc.Replay = te.KVEventsAddr(), te.KVEventsReplayAddr()
			f, err := kvevents.NewFollower(fc, mir, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			f.Start(ctx)
			defer f.Close()

			rng := rand.New(rand.NewPCG(uint64(chunk), 9))
			bases := make([][]uint32, 8)
			for i := range bases {
				bases[i] = make([]uint32, 96+rng.IntN(300))
				for j := range bases[i] {
					bases[i][j] = uint32(rng.IntN(5000))
				}
			}
			prompt := func(r *rand.Rand) ([]uint32, uint64) {
				b := bases[r.IntN(len(bases))]
				p := slices.Clone(b[:16+r.IntN(len(b)-16)])
				for k := r.IntN(40); k > 0; k-- {
					p = append(p, uint32(r.IntN(5000)))
				}
				return p, uint64(r.IntN(2)) // base model or adapter 1
			}
			for i := 0; i < 200; i++ {
				p, a := prompt(rng)
				resp, b := te.post(t, "/v1/completions", map[string]any{"prompt": p, "max_tokens": 2, "adapter_id": a})
				if resp.StatusCode != 200 {
					t.Fatalf("%d %s", resp.StatusCode, b)
				}
			}
			st := te.TierStats()
			if st.Stored == 0 || st.Evicted == 0 || st.Unspillable != 0 {
				t.Fatalf("CPU tier %+v: the workload must spill and make the CPU evict", st)
			}

			probes := make([][]uint32, 0, 60)
			adapters := make([]uint64, 0, 60)
			for _, b := range bases {
				probes, adapters = append(probes, b, b), append(adapters, 0, 1)
			}
			for len(probes) < cap(probes) {
				p, a := prompt(rng)
				probes, adapters = append(probes, p), append(adapters, a)
			}
			// diff is "" once the mirror's per-tier view is the engine's.
			diff := func() string {
				te.mu.Lock()
				defer te.mu.Unlock()
				visible, _ := te.cache.SummarySnapshot(nil)
				ms := mir.MirrorStats()
				if ms.Tiers[kvevents.TierCPU] != te.cpu.Stats().Blocks || ms.Tiers[kvevents.TierGPU] != len(visible) {
					return fmt.Sprintf("mirror copies gpu %d cpu %d, engine gpu %d cpu %d",
						ms.Tiers[kvevents.TierGPU], ms.Tiers[kvevents.TierCPU], len(visible), te.cpu.Stats().Blocks)
				}
				for i, p := range probes {
					gpu, cpu := te.peekTiersLocked(p, adapters[i])
					got := mir.PeekMatchedTokensByTier(p, cfg.BlockSize, adapters[i])
					if got[kvevents.TierGPU] != gpu || got[kvevents.TierCPU] != cpu {
						return fmt.Sprintf("probe %d: mirror gpu %d cpu %d, engine gpu %d cpu %d",
							i, got[kvevents.TierGPU], got[kvevents.TierCPU], gpu, cpu)
					}
				}
				return ""
			}
			var last string
			deadline := time.Now().Add(20 * time.Second)
			for last = diff(); last != ""; last = diff() {
				if time.Now().After(deadline) {
					t.Fatalf("mirror never matched the engine: %s", last)
				}
				time.Sleep(5 * time.Millisecond)
			}
			cpuCredited := 0
			for i, p := range probes {
				cpuCredited += mir.PeekMatchedTokensByTier(p, cfg.BlockSize, adapters[i])[kvevents.TierCPU]
			}
			t.Logf("tier %+v, CPU tokens credited over the probes %d", st, cpuCredited)
			if cpuCredited == 0 {
				t.Fatal("no probe continues on the CPU: the per-tier comparison proved nothing")
			}
			if s := mir.MirrorStats(); s.Underrun != 0 || s.Unknown != 0 {
				t.Fatalf("mirror stats %+v", s)
			}
		})
	}
}

// The wire form of a CPU chunk, read back through the engine's replay socket and decoded as
// plain msgpack, against what vLLM ≥ 0.24 writes with self_describing_kv_events
// (vllm/distributed/kv_transfer/kv_connector/v1/offloading/events.py). For chunk k of a request,
// OffloadingEventsTracker._build_event_metadata takes block_hashes = req.block_hashes[k·H :
// (k+1)·H] (H = hashes_per_chunk = CPU block size / GPU block size), parent_block_hash =
// req.block_hashes[k·H−1] or None for k = 0, token_ids = req.all_token_ids[k·T : (k+1)·T]
// (T = tokens_per_chunk), block_size = tokens_per_block (the GPU block size) and the request's
// lora_name; _take_stored_event writes medium MEDIUM_CPU, "CPU" (vllm/distributed/kv_events.py);
// _take_removed_event fans an eviction out to the same block_hashes under the same medium.
// The expected token ids below are the prompt's own, and the hashes are checked against the
// GPU BlockStored that first announced the same blocks.
func TestKVEventsCPUChunkWire(t *testing.T) {
	cfg := fastConfig()
	cfg.BlockSize = 4
	cfg.KVBlocks = 12
	cfg.CPUBlocks, cfg.CPUChunkBlocks = 8, 4 // two chunks of 16 tokens
	cfg.KVEvents.Endpoint, cfg.KVEvents.Replay = "tcp://127.0.0.1:0", "tcp://127.0.0.1:0"
	cfg.KVEvents.Layout, cfg.KVEvents.Hashes = kvevents.LayoutMap, kvevents.HashInt
	te := startEngine(t, cfg)
	send := func(prompt []uint32, adapter int) {
		resp, b := te.post(t, "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1, "adapter_id": adapter})
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
	}
	a := tokenPrompt(33, 1)       // tokens 1..33 under adapter 7: 8 full blocks, 2 chunks
	send(a, 7)                    //
	send(tokenPrompt(40, 100), 0) // evicts a: both chunks spill, filling the tier
	send(tokenPrompt(40, 200), 0) // evicts the second prompt: its chunks push a's out

	var events []map[string]any
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _, complete, err := kvevents.Replay(ctx, te.KVEventsReplayAddr(), 0, func(_ uint64, payload []byte) error {
		var batch any // EventBatch: [ts, events, data_parallel_rank], or a map of the same
		if err := msgpack.Unmarshal(payload, &batch); err != nil {
			return err
		}
		var evs any
		switch b := batch.(type) {
		case []any:
			evs = b[1]
		case map[string]any:
			evs = b["events"]
		}
		for _, ev := range evs.([]any) {
			events = append(events, ev.(map[string]any))
		}
		return nil
	})
	if err != nil || !complete {
		t.Fatalf("replay: complete %v, %v", complete, err)
	}

	var gpuA []uint64 // the hashes of a's 8 full blocks, from its GPU BlockStored
	var stored, removed []map[string]any
	for _, ev := range events {
		switch {
		case ev["type"] == "BlockStored" && ev["medium"] == "GPU" && gpuA == nil:
			gpuA = uints(t, ev["block_hashes"])
		case ev["type"] == "BlockStored" && ev["medium"] == "CPU":
			stored = append(stored, ev)
		case ev["type"] == "BlockRemoved" && ev["medium"] == "CPU":
			removed = append(removed, ev)
		}
	}
	if len(gpuA) != 8 || len(stored) != 4 || len(removed) != 2 {
		t.Fatalf("GPU store of a %d hashes, CPU stores %d, CPU removals %d; want 8, 4, 2", len(gpuA), len(stored), len(removed))
	}
	// a's chunks spill leaf first: chunk 1 (blocks 4..7), then chunk 0 (blocks 0..3).
	for i, want := range []struct {
		hashes []uint64
		parent any
		tokens []uint64
	}{
		{gpuA[4:8], gpuA[3], []uint64{17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32}},
		{gpuA[0:4], nil, []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}},
	} {
		ev := stored[i]
		if got := uints(t, ev["block_hashes"]); !slices.Equal(got, want.hashes) {
			t.Errorf("chunk %d: block_hashes %v, want %v", 1-i, got, want.hashes)
		}
		if got := ev["parent_block_hash"]; (want.parent == nil) != (got == nil) || (got != nil && uints(t, []any{got})[0] != want.parent) {
			t.Errorf("chunk %d: parent_block_hash %v, want %v", 1-i, got, want.parent)
		}
		if got := uints(t, ev["token_ids"]); !slices.Equal(got, want.tokens) {
			t.Errorf("chunk %d: token_ids %v, want %v", 1-i, got, want.tokens)
		}
		if got := uints(t, []any{ev["block_size"]}); got[0] != 4 {
			t.Errorf("chunk %d: block_size %d, want the GPU block size 4", 1-i, got[0])
		}
		if ev["lora_name"] != "7" {
			t.Errorf("chunk %d: lora_name %v, want \"7\"", 1-i, ev["lora_name"])
		}
	}
	// The second prompt's chunks evict a's, least recently used first: chunk 1, then chunk 0.
	if got := uints(t, removed[0]["block_hashes"]); !slices.Equal(got, gpuA[4:8]) {
		t.Errorf("first removal %v, want chunk 1's %v", got, gpuA[4:8])
	}
	if got := uints(t, removed[1]["block_hashes"]); !slices.Equal(got, gpuA[0:4]) {
		t.Errorf("second removal %v, want chunk 0's %v", got, gpuA[0:4])
	}
	if ev := stored[2]; ev["lora_name"] != nil || len(uints(t, ev["token_ids"])) != 16 {
		t.Errorf("the base model's chunk: %v", ev)
	}
}

// uints reads a msgpack array of non-negative integers, whatever width each was encoded in.
func uints(t *testing.T, v any) []uint64 {
	t.Helper()
	arr, ok := v.([]any)
	if !ok {
		t.Fatalf("%v (%T) is not an array", v, v)
	}
	out := make([]uint64, len(arr))
	for i, x := range arr {
		switch n := x.(type) {
		case uint64:
			out[i] = n
		case uint32:
			out[i] = uint64(n)
		case uint16:
			out[i] = uint64(n)
		case uint8:
			out[i] = uint64(n)
		case int64:
			out[i] = uint64(n)
		case int32:
			out[i] = uint64(n)
		case int16:
			out[i] = uint64(n)
		case int8:
			out[i] = uint64(n)
		default:
			t.Fatalf("element %d: %v (%T) is not an integer", i, x, x)
		}
	}
	return out
}
