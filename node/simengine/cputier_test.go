package simengine

import (
	"math"
	"slices"
	"strconv"
	"testing"
)

// A system prompt is served, pushed out of a small GPU pool by another prompt (spilling to the
// CPU tier), and asked for again under a new question: the whole prefix comes back as
// cached_tokens, as vLLM reports the local hit plus the connector's external tokens
// (vllm/v1/core/sched/scheduler.py: num_computed_tokens = num_new_local_computed_tokens +
// num_external_computed_tokens, then request.num_cached_tokens = num_computed_tokens), and the
// simulated clock charges those tokens at the load rate and only the question at the prefill
// rate. A later request then finds its prefix partly on the GPU (the promoted system prompt)
// and partly on the CPU.
func TestCPUTierSpillAndLoad(t *testing.T) {
	cfg := fastConfig()
	cfg.KVBlocks = 16 // 256 tokens: one 240-token prompt evicts everything else
	cfg.CPUBlocks = 64
	cfg.PrefillTokensPerSec = 1e6
	cfg.CPULoadTokensPerSec = 15e6
	te := startEngine(t, cfg)

	sys := tokenPrompt(128, 1000) // 8 blocks
	ask := func(question []uint32) []uint32 { return append(slices.Clone(sys), question...) }
	first := ask(tokenPrompt(20, 5000)) // 148 tokens: 9 full blocks
	send := func(prompt []uint32) (cached int) {
		t.Helper()
		resp, b := te.post(t, "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 2})
		r := decodeResponse(t, b)
		if resp.StatusCode != 200 || resp.Header.Get(HeaderCachedTokens) != strconv.Itoa(r.Usage.PromptTokensDetails.CachedTokens) {
			t.Fatalf("%d %s (header %q)", resp.StatusCode, b, resp.Header.Get(HeaderCachedTokens))
		}
		return r.Usage.PromptTokensDetails.CachedTokens
	}
	type charges struct{ cached, loaded, prefillTok, loadSec, prefillSec float64 }
	read := func() charges {
		return charges{
			counterValue(t, te, "prefixmesh_simengine_cached_tokens_total", nil),
			counterValue(t, te, "prefixmesh_simengine_cpu_loaded_tokens_total", nil),
			counterValue(t, te, "prefixmesh_simengine_prefill_tokens_total", nil),
			counterValue(t, te, "prefixmesh_simengine_cpu_load_seconds_total", nil),
			counterValue(t, te, "prefixmesh_simengine_prefill_seconds_total", nil),
		}
	}
	// expect checks one request's charges: cached tokens, of them loaded from the CPU, and the
	// simulated seconds (prefill of the rest at 1M tok/s, load at 15M tok/s).
	expect := func(before charges, prompt []uint32, cached, loaded int) {
		t.Helper()
		d := read()
		uncached := len(prompt) - cached
		for _, c := range []struct {
			name      string
			got, want float64
		}{
			{"cached tokens", d.cached - before.cached, float64(cached)},
			{"CPU-loaded tokens", d.loaded - before.loaded, float64(loaded)},
			{"prefilled tokens", d.prefillTok - before.prefillTok, float64(uncached)},
			{"load seconds", d.loadSec - before.loadSec, float64(loaded) / 15e6},
			{"prefill seconds", d.prefillSec - before.prefillSec, float64(uncached) / 1e6},
		} {
			if math.Abs(c.got-c.want) > 1e-9 {
				t.Errorf("%s: %v, want %v", c.name, c.got, c.want)
			}
		}
	}

	before := read()
	if got := send(first); got != 0 {
		t.Fatalf("cold request: cached %d", got)
	}
	expect(before, first, 0, 0)
	if got := send(tokenPrompt(240, 20000)); got != 0 {
		t.Fatalf("the other prompt: cached %d", got)
	}
	if got := te.cache.PeekMatchedTokens(sys, cfg.BlockSize, 0); got != 0 {
		t.Fatalf("the system prompt is still on the GPU (%d tokens): nothing spilled", got)
	}
	if st := te.TierStats(); st.CPUBlocks != 9 || st.Stored != 9 || st.Evicted != 0 {
		t.Fatalf("CPU tier %+v, want the first prompt's 9 full blocks", st)
	}

	// The system prompt under a new question: 8 blocks from the CPU, 30 tokens prefilled.
	second := ask(tokenPrompt(30, 7000))
	before = read()
	if got := send(second); got != 128 {
		t.Fatalf("second question: cached %d, want the 128-token system prompt", got)
	}
	expect(before, second, 128, 128)
	// Loaded blocks are promoted into the GPU pool, inserted with the prompt.
	if got := te.cache.PeekMatchedTokens(second, cfg.BlockSize, 0); got != 144 {
		t.Fatalf("GPU after the load: %d tokens, want the 9 full blocks", got)
	}

	// The first question again: the system prompt on the GPU, its next block on the CPU; the
	// hit is capped at 144 (a 148-token prompt recomputes its last token's block).
	before = read()
	if got := send(first); got != 144 {
		t.Fatalf("first question again: cached %d, want 144", got)
	}
	expect(before, first, 144, 16)
	if st := te.TierStats(); st.Unspillable != 0 {
		t.Fatalf("%d chunks could not be spilled", st.Unspillable)
	}
	te.checkDrained(t)
}

// Chunks bigger than a block: a chunk is spilled only when whole (the prompt's trailing blocks
// that fill no chunk are not), a hit shorter than one chunk is recomputed as vLLM's connector
// does (get_num_new_matched_tokens returns 0 under offloaded_block_size tokens), and a hit that
// starts inside a chunk continues from the GPU prefix.
func TestCPUTierChunks(t *testing.T) {
	cfg := fastConfig()
	cfg.BlockSize = 4
	cfg.KVBlocks = 12
	cfg.CPUBlocks, cfg.CPUChunkBlocks = 16, 4
	te := startEngine(t, cfg)
	send := func(prompt []uint32) int {
		t.Helper()
		resp, b := te.post(t, "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1})
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		return decodeResponse(t, b).Usage.PromptTokensDetails.CachedTokens
	}
	a := tokenPrompt(42, 1) // 10 full blocks: chunks 0 and 1, and blocks 8 and 9 in no chunk
	send(a)
	send(tokenPrompt(44, 500)) // 12 blocks: evicts all of a
	if st := te.TierStats(); st.CPUBlocks != 8 || st.Stored != 2 {
		t.Fatalf("CPU tier %+v, want a's two whole chunks", st)
	}
	te.mu.Lock()
	gpu, cpu := te.peekTiersLocked(a, 0)
	te.mu.Unlock()
	if gpu != 0 || cpu != 32 {
		t.Fatalf("peek gpu %d cpu %d, want 0 and 32", gpu, cpu)
	}
	if got := send(a); got != 32 {
		t.Fatalf("cached %d, want the two chunks' 32 tokens", got)
	}

	// Only the first 6 blocks of b's prefix on the GPU; the chunk [4..7] on the CPU continues
	// it by 2 blocks, under one chunk: recomputed, not loaded.
	te.mu.Lock()
	te.pool.Reclaim(cfg.KVBlocks) // spill everything; the CPU tier keeps a's chunks
	te.mu.Unlock()
	send(tokenPrompt(24, 1)) // a's first 6 blocks back on the GPU (chunk 0 from the CPU)
	te.mu.Lock()
	gpu, cpu = te.peekTiersLocked(a[:33], 0)
	te.mu.Unlock()
	if gpu != 24 || cpu != 8 {
		t.Fatalf("peek gpu %d cpu %d, want 24 and 8", gpu, cpu)
	}
	loaded := counterValue(t, te, "prefixmesh_simengine_cpu_loaded_tokens_total", nil)
	if got := send(a[:33]); got != 24 {
		t.Fatalf("cached %d, want the GPU's 24 (an 8-token CPU hit is under one chunk)", got)
	}
	if d := counterValue(t, te, "prefixmesh_simengine_cpu_loaded_tokens_total", nil) - loaded; d != 0 {
		t.Fatalf("loaded %v tokens for a sub-chunk hit", d)
	}
	te.checkDrained(t)
}
