package local

// EngineCachedTokens is the cached_tokens a vLLM-style engine reports for a prompt of
// promptTokens tokens whose first matchedTokens are cached: hits are whole blocks and capped at
// promptTokens − 1 (the last prompt token is always recomputed, to produce the first output
// token), so a fully cached N-token prompt reports floor((N−1)/B)·B. The router's estimate and the
// simulated engine's report both apply it here, once. Arguments out of range give 0.
func EngineCachedTokens(matchedTokens, promptTokens, blockSize int) int {
	if blockSize <= 0 || promptTokens <= 0 || matchedTokens <= 0 {
		return 0
	}
	capped := (promptTokens - 1) / blockSize * blockSize
	hit := matchedTokens / blockSize * blockSize
	return min(hit, capped)
}
