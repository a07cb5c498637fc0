package local

// PrefixCache is the seed's node-local prefix cache contract (CONTRACT.md in this directory,
// method by method), one method per method of the reference's Rust trait. Implementations are safe for concurrent use.
type PrefixCache interface {
	IsActive() bool
	Lookup(tokens []uint32, blockSize int, sessionHash, adapterID uint64) PrefixMatch
	PeekMatchedTokens(tokens []uint32, blockSize int, adapterID uint64) int
	PinPrefix(tokens []uint32, blockSize int, adapterID uint64) int
	Insert(tokens, blockTable, diskBlockIDs []uint32, blockSize, matchedTokens int, adapterID uint64) InsertAcquired
	InsertWithSnapshot(tokens, blockTable, diskBlockIDs []uint32, blockSize, snapshotID int, sessionHash uint64, matchedTokens int, adapterID uint64) (displaced int, ok bool, acq InsertAcquired)
	InsertIntermediateSnapshot(tokens, blockTable, diskBlockIDs []uint32, blockSize, snapshotID int, sessionHash uint64, matchedTokens int, adapterID uint64) (displaced int, ok bool)
	InsertTailSnapshot(tokens []uint32, snapshotID int, sessionHash, adapterID uint64) []int
	InsertTailSiblingSnapshot(tokens []uint32, snapshotID int, sessionHash, adapterID uint64) (displaced int, ok bool)
	Release(tokens []uint32, blockSize int, adapterID uint64)
	ReleaseMatched(tokens []uint32, blockSize, matchedTokens int, adapterID uint64)
	Evict(numBlocks int) EvictedBlocks
	EvictSnapshotLRU() (slot int, ok bool)
	EvictSnapshotSlot(slot int) bool
	EvictSnapshotToTier(minTokens int) (TierEvict, bool)
	PromoteSnapshot(key uint64, newSlot int) bool
	ForgetSnapshotTierKey(key uint64) bool
	SnapshotCount() int
	Stats() (entries, cachedBlocks int)
}

// NoBlock is the u32::MAX sentinel: "no KV block" in a block table, "no disk block" in a disk list.
const NoBlock uint32 = 0xFFFFFFFF

// PrefixMatch is the result of Lookup (CONTRACT.md, "Result types"). The zero value is the empty match.
type PrefixMatch struct {
	MatchedBlocks       []uint32 // KV blocks of the matched prefix, in token order
	MatchedDiskBlockIDs []uint32 // empty, or parallel to MatchedBlocks (NoBlock where a node has none)
	MatchedTokens       int
	SSMSnapshot         int  // resident slot of the deepest usable anchor, valid when HasSSMSnapshot
	HasSSMSnapshot      bool //
	SSMSnapshotTokens   int  // depth of the resident anchor, else 0
	SSMSnapshotTierKey  uint64
	HasSSMSnapshotTier  bool // the deepest anchor is spilled under SSMSnapshotTierKey
	SSMSnapshotTierToks int  // depth of the spilled anchor, else 0
	SSMSnapshotIsTail   bool // the winning anchor is a tail capture
}

// IsEmpty reports whether nothing matched.
func (m PrefixMatch) IsEmpty() bool { return m.MatchedTokens == 0 }

// InsertAcquired tells the caller which references to move after an insert (CONTRACT.md, "The caller's contract"): take a
// disk ref on each DiskBlockIDs entry and a KV ref on each Blocks entry before dropping one on
// each ReleasedBlocks entry. ReleasedDiskBlockIDs lists disk ids the cache stopped holding (a
// replaced partial suffix), which the reference leaked: drop one disk ref on each.
type InsertAcquired struct {
	DiskBlockIDs         []uint32
	Blocks               []uint32
	ReleasedBlocks       []uint32
	ReleasedDiskBlockIDs []uint32
}

// EvictedBlocks are the blocks the cache no longer stores: hand back the cache's KV ref on each
// Physical block and a disk ref on each DiskBlockIDs entry (never NoBlock, not parallel).
type EvictedBlocks struct {
	Physical     []uint32
	DiskBlockIDs []uint32
}

// IsEmpty reports whether no physical block was evicted.
func (e EvictedBlocks) IsEmpty() bool { return len(e.Physical) == 0 }

// Len is the number of physical blocks evicted.
func (e EvictedBlocks) Len() int { return len(e.Physical) }

// TierEvict is the result of EvictSnapshotToTier: Spill keeps the entry, now findable under Key
// in the caller's tier store; Drop removed it. Either way Slot is the caller's to free.
type TierEvict struct {
	Spill bool   // true: Spill{Slot, Key, Depth}; false: Drop{Slot, Depth}
	Slot  int    //
	Key   uint64 // the entry's prefix hash; meaningful only when Spill
	Depth int    // the entry's token count
}

// HitStats are a tree's lookup counters (CONTRACT.md, "Hit counters"), per instance.
type HitStats struct {
	Hits      uint64 // lookups that matched > 0 tokens
	Misses    uint64 // lookups that matched nothing
	HitTokens uint64 // sum of matched tokens over hits
}

// Options are the tree's tunables; the zero value is the reference's default behaviour.
type Options struct {
	// SubBlockMatching lets a match end inside a block (CONTRACT.md, "Sub-block matching"). Off by
	// default because the paged KV path has no copy-on-write: two writers into one block tear it.
	SubBlockMatching bool
	// Hermetic confines every snapshot entry to its own nonzero session (CONTRACT.md, "The session gate").
	Hermetic bool
	// DisableTailLease turns off the live session's tail/sibling protection (CONTRACT.md, "Victim choice and
	// the tail lease").
	DisableTailLease bool
	// TailLeaseTTL is how many snapshot evictions a lease survives without a lookup from its
	// session; 0 means the reference's 64, long enough for one turn's churn, short enough that a
	// dead session cannot hold a slot forever.
	TailLeaseTTL uint32
	// SnapshotEvictAlpha weights depth against recency inside a session when choosing a snapshot
	// victim, clamped to [0, 8]; 0 is pure LRU (the reference's default).
	SnapshotEvictAlpha float64
	// LegacySnapshotEviction picks snapshot victims by plain per-entry LRU (CONTRACT.md, "Snapshot
	// eviction").
	LegacySnapshotEviction bool
	// JournalCapacity bounds the summary journal ring; 0 means DefaultJournalCapacity. A consumer
	// that falls further behind than this takes a full snapshot instead.
	JournalCapacity int
}

// DefaultJournalCapacity holds about 3 s of changes at 20k block changes per second, several
// gossip rounds, while costing 1 MiB (16 bytes per entry).
const DefaultJournalCapacity = 1 << 16

// DefaultTailLeaseTTL is the reference's lease length in snapshot evictions.
const DefaultTailLeaseTTL = 64

// SummaryEvent is one change to the set of visible full-block hashes.
type SummaryEvent struct {
	Seq   uint64 // 1, 2, 3, … per tree; 0 is "before the first change"
	Hash  uint64 // canonical chained block hash (hash.go)
	Added bool   // true: became visible to walk; false: evicted or became invisible
}
