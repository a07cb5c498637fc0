package local

// NoPrefixCaching is the cache that caches nothing (CONTRACT.md, "NoPrefixCaching"): lookups miss without counting,
// inserts acquire nothing, and IsActive is false so callers skip all KV-ref bookkeeping tied to
// the cache.
var NoPrefixCaching PrefixCache = noPrefixCaching{}

// noPrefixCaching is zero-size; every method does nothing.
type noPrefixCaching struct{}

var _ PrefixCache = noPrefixCaching{}

func (noPrefixCaching) IsActive() bool { return false }

func (noPrefixCaching) Lookup([]uint32, int, uint64, uint64) PrefixMatch { return PrefixMatch{} }

func (noPrefixCaching) PeekMatchedTokens([]uint32, int, uint64) int { return 0 }

func (noPrefixCaching) PinPrefix([]uint32, int, uint64) int { return 0 }

func (noPrefixCaching) Insert(_, _, _ []uint32, _, _ int, _ uint64) InsertAcquired {
	return InsertAcquired{}
}

func (noPrefixCaching) InsertWithSnapshot(_, _, _ []uint32, _, _ int, _ uint64, _ int, _ uint64) (int, bool, InsertAcquired) {
	return 0, false, InsertAcquired{}
}

func (noPrefixCaching) InsertIntermediateSnapshot(_, _, _ []uint32, _, _ int, _ uint64, _ int, _ uint64) (int, bool) {
	return 0, false
}

func (noPrefixCaching) InsertTailSnapshot([]uint32, int, uint64, uint64) []int { return nil }

func (noPrefixCaching) InsertTailSiblingSnapshot([]uint32, int, uint64, uint64) (int, bool) {
	return 0, false
}

func (noPrefixCaching) Release([]uint32, int, uint64) {}

func (noPrefixCaching) ReleaseMatched([]uint32, int, int, uint64) {}

func (noPrefixCaching) Evict(int) EvictedBlocks { return EvictedBlocks{} }

func (noPrefixCaching) EvictSnapshotLRU() (int, bool) { return 0, false }

func (noPrefixCaching) EvictSnapshotSlot(int) bool { return false }

func (noPrefixCaching) EvictSnapshotToTier(int) (TierEvict, bool) { return TierEvict{}, false }

func (noPrefixCaching) PromoteSnapshot(uint64, int) bool { return false }

func (noPrefixCaching) ForgetSnapshotTierKey(uint64) bool { return false }

func (noPrefixCaching) SnapshotCount() int { return 0 }

func (noPrefixCaching) Stats() (entries, cachedBlocks int) { return 0, 0 }
