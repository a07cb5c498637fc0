package kvevents

import "github.com/prefixmesh/prefixmesh/local"

// The node.Tree face of the mirror. The engine owns its cache, so the calls that would take
// holds, insert or evict (which node.Server refuses in read-only mode before they get here) do
// nothing and return the empty result; the reads answer from the mirror.

var _ local.PrefixCache = (*CacheMirror)(nil)

// PeekMatchedTokens is what the engine would match for tokens: the longest run of full blocks,
// from the first, whose canonical hashes are visible. It does not allocate.
func (m *CacheMirror) PeekMatchedTokens(tokens []uint32, blockSize int, adapterID uint64) int {
	if blockSize <= 0 {
		return 0
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	h := local.AdapterSeed(adapterID)
	n := 0
	for i := 0; i+blockSize <= len(tokens); i += blockSize {
		h = local.ChainHash(h, tokens[i:i+blockSize])
		if m.canon[h] == 0 {
			break
		}
		n += blockSize
	}
	return n
}

// NumTiers is the number of tiers (Tier values), the length of TierTokens.
const NumTiers = int(numTiers)

// TierTokens holds tokens per tier, indexed by Tier.
type TierTokens [numTiers]int

// PeekMatchedTokensByTier is PeekMatchedTokens per tier: [TierGPU] is the GPU prefix the engine
// would match (PeekMatchedTokens), and each lower tier t says how many tokens past that prefix
// t continues it, block by block from the first block after the GPU prefix, each tier on its
// own. A lower tier only ever continues the GPU prefix: a block it holds after a block nobody
// holds is not counted, since the engine loads offloaded blocks only as the next blocks of a
// prefix it already has. An engine with a CPU and a disk tier loads from either, so what it can
// skip is the GPU prefix plus at least the longest continuation (more if the tiers interleave,
// which this does not claim). TierOther is reported but is no place the engine loads from that
// this package knows. It does not allocate.
func (m *CacheMirror) PeekMatchedTokensByTier(tokens []uint32, blockSize int, adapterID uint64) TierTokens {
	var out TierTokens
	if blockSize <= 0 {
		return out
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.expireLocked()
	h := local.AdapterSeed(adapterID)
	i := 0
	for ; i+blockSize <= len(tokens); i += blockSize {
		next := local.ChainHash(h, tokens[i:i+blockSize])
		if m.canon[next] == 0 {
			break
		}
		h = next
		out[TierGPU] += blockSize
	}
	if len(m.lower) == 0 {
		return out
	}
	var live uint8 = (1<<numTiers - 1) &^ 1 // lower tiers still continuing the prefix
	for ; live != 0 && i+blockSize <= len(tokens); i += blockSize {
		h = local.ChainHash(h, tokens[i:i+blockSize])
		v, ok := m.lower[h]
		if !ok {
			break
		}
		for t := TierGPU + 1; t < numTiers; t++ {
			if live&(1<<t) == 0 {
				continue
			}
			if v[t] == 0 {
				live &^= 1 << t
				continue
			}
			out[t] += blockSize
		}
	}
	return out
}

// IsActive reports true: the mirror answers for a real cache.
func (m *CacheMirror) IsActive() bool { return true }

// Stats returns the visible blocks twice (the summary's size).
func (m *CacheMirror) Stats() (entries, cachedBlocks int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.canon), len(m.canon)
}

// HitStats is zero: the engine, not the mirror, serves lookups.
func (m *CacheMirror) HitStats() local.HitStats { return local.HitStats{} }

// SnapshotStats is zero: engines do not report SSM snapshots in KV events.
func (m *CacheMirror) SnapshotStats() local.SnapshotStats { return local.SnapshotStats{} }

// SnapshotCount is 0 (see SnapshotStats).
func (m *CacheMirror) SnapshotCount() int { return 0 }

// Lookup returns the empty match: holds belong to the engine.
func (m *CacheMirror) Lookup([]uint32, int, uint64, uint64) local.PrefixMatch {
	return local.PrefixMatch{}
}

// PinPrefix pins nothing and returns 0.
func (m *CacheMirror) PinPrefix([]uint32, int, uint64) int { return 0 }

// Insert inserts nothing: blocks arrive as BlockStored events.
func (m *CacheMirror) Insert(_, _, _ []uint32, _, _ int, _ uint64) local.InsertAcquired {
	return local.InsertAcquired{}
}

// InsertWithSnapshot does nothing.
func (m *CacheMirror) InsertWithSnapshot(_, _, _ []uint32, _, _ int, _ uint64, _ int, _ uint64) (int, bool, local.InsertAcquired) {
	return 0, false, local.InsertAcquired{}
}

// InsertIntermediateSnapshot does nothing.
func (m *CacheMirror) InsertIntermediateSnapshot(_, _, _ []uint32, _, _ int, _ uint64, _ int, _ uint64) (int, bool) {
	return 0, false
}

// InsertTailSnapshot does nothing.
func (m *CacheMirror) InsertTailSnapshot([]uint32, int, uint64, uint64) []int { return nil }

// InsertTailSiblingSnapshot does nothing.
func (m *CacheMirror) InsertTailSiblingSnapshot([]uint32, int, uint64, uint64) (int, bool) {
	return 0, false
}

// Release does nothing.
func (m *CacheMirror) Release([]uint32, int, uint64) {}

// ReleaseMatched does nothing.
func (m *CacheMirror) ReleaseMatched([]uint32, int, int, uint64) {}

// Evict evicts nothing: blocks leave as BlockRemoved events.
func (m *CacheMirror) Evict(int) local.EvictedBlocks { return local.EvictedBlocks{} }

// EvictSnapshotLRU does nothing.
func (m *CacheMirror) EvictSnapshotLRU() (int, bool) { return 0, false }

// EvictSnapshotSlot does nothing.
func (m *CacheMirror) EvictSnapshotSlot(int) bool { return false }

// EvictSnapshotToTier does nothing.
func (m *CacheMirror) EvictSnapshotToTier(int) (local.TierEvict, bool) {
	return local.TierEvict{}, false
}

// PromoteSnapshot does nothing.
func (m *CacheMirror) PromoteSnapshot(uint64, int) bool { return false }

// ForgetSnapshotTierKey does nothing.
func (m *CacheMirror) ForgetSnapshotTierKey(uint64) bool { return false }
