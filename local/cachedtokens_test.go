package local

import "testing"

func TestEngineCachedTokens(t *testing.T) {
	for _, c := range []struct{ matched, prompt, bs, want int }{
		{32, 32, 16, 16}, // fully cached, N a multiple of B: the last block is recomputed
		{32, 33, 16, 32}, // fully cached full blocks and one more token: all of them count
		{16, 40, 16, 16},
		{0, 40, 16, 0},
		{16, 16, 16, 0}, // one-block prompt: the only block holds the last token
		{48, 40, 16, 32},
		{20, 40, 16, 16}, // a sub-block match counts whole blocks only
		{16, 1, 16, 0},
		{16, 0, 16, 0},
		{16, 40, 0, 0},
		{-5, 40, 16, 0},
	} {
		if got := EngineCachedTokens(c.matched, c.prompt, c.bs); got != c.want {
			t.Errorf("EngineCachedTokens(%d, %d, %d) = %d, want %d", c.matched, c.prompt, c.bs, got, c.want)
		}
	}
}

// Vectors from vLLM, not from this package's rule. vLLM's KVCacheManager.get_computed_blocks
// (vllm/v1/core/kv_cache_manager.py) caps the lookup at max_cache_hit_length =
// request.num_tokens - 1, and FullAttentionManager.find_longest_cache_hit
// (vllm/v1/core/single_type_kv_cache_manager.py) matches at most max_length // block_size
// whole blocks; cached_tokens is the resulting num_computed_tokens. The first two rows are
// tests/v1/core/test_prefix_caching.py::test_prefill with block_size 16: a 55-token prompt
// (3 full blocks of common ids + 7 tokens) on an empty cache computes 0, and the next request,
// the same 3 blocks + 5 new tokens (53), hits "3 * 16". The others follow the two statements: a
// fully cached 48-token prompt looks up at most 47 tokens, so 47 // 16 = 2 blocks; 49 tokens
// look up 48, all 3 blocks.
func TestEngineCachedTokensVLLMVectors(t *testing.T) {
	for _, c := range []struct{ matched, prompt, want int }{
		{0, 55, 0},   // test_prefill req0: "assert num_computed_tokens == 0"
		{48, 53, 48}, // test_prefill req1: "assert num_computed_tokens == 3 * 16"
		{48, 48, 32}, // max_cache_hit_length 47 → 2 blocks
		{48, 49, 48}, // max_cache_hit_length 48 → 3 blocks
		{64, 17, 16}, // max_cache_hit_length 16 → 1 block, whatever else is cached
		{16, 16, 0},  // max_cache_hit_length 15 → no block
	} {
		if got := EngineCachedTokens(c.matched, c.prompt, 16); got != c.want {
			t.Errorf("EngineCachedTokens(%d, %d, 16) = %d, vLLM computes %d", c.matched, c.prompt, got, c.want)
		}
	}
}
