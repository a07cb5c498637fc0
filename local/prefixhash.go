package local

// The SSM snapshot key (CONTRACT.md, "Entries and keys"): FNV-1a-style over 32-bit words, not bytes. Each step XORs
// the 64-bit state with the zero-extended value and multiplies by the FNV-64 prime, wrapping.
// A nonzero adapter id is folded in first as one 64-bit step, so base-model keys equal the plain
// token-only hash and keys of different adapters differ (index isolation).
//
// This is deliberately not the canonical block hash of hash.go: the key covers an arbitrary
// (possibly unaligned) token count, and it stays bit-compatible with the reference's keys, which
// the engine stores tier blobs under.

const (
	prefixHashOffset uint64 = 0xcbf29ce484222325 // FNV-64 offset basis
	prefixHashPrime  uint64 = 0x100000001b3      // FNV-64 prime
)

// prefixHashSeed is the state after the adapter step, before any token.
func prefixHashSeed(adapterID uint64) uint64 {
	h := prefixHashOffset
	if adapterID != 0 {
		h = (h ^ adapterID) * prefixHashPrime
	}
	return h
}

// prefixHashExtend applies one step per token to h.
func prefixHashExtend(h uint64, tokens []uint32) uint64 {
	for _, t := range tokens {
		h = (h ^ uint64(t)) * prefixHashPrime
	}
	return h
}

// prefixHash is hash_token_prefix(tokens, count, adapter): the key of the snapshot taken after
// the first count tokens. count is clamped to [0, len(tokens)] so that no input panics.
func prefixHash(tokens []uint32, count int, adapterID uint64) uint64 {
	count = max(0, min(count, len(tokens)))
	return prefixHashExtend(prefixHashSeed(adapterID), tokens[:count])
}
