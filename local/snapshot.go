package local

import (
	"cmp"
	"math"
	"slices"
	"sync"
)

// The SSM snapshot index (CONTRACT.md, "The snapshot index"). It maps a token prefix, as its prefixHash key, to where the
// SSM state after that prefix lives: a resident pool slot, or a tier key once the entry has been
// spilled. It is independent of the radix tree: evicting tree nodes never touches it and the
// reverse; the two are guarded by separate mutexes and no method holds both.
//
// Layout. entries is the reference's flat list, scanned linearly by victim choice and removed
// from by swap-remove, so list order (which breaks victim ties) is the reference's. Two
// secondary structures make the hot path cheap without changing any observable order:
//
//   - byKey maps a key to its entry (at most one entry per key, invariant 13), so every insert,
//     promote and forget is O(1) instead of a scan;
//   - byDepth holds one (depth, key, idx) triple per entry sorted by (depth, key). lookupTiered
//     walks it in ascending depth, extending one running FNV hash over the prompt as it goes, and
//     compares each entry's key with the hash at that entry's depth. A lookup therefore hashes the
//     prompt once up to the deepest candidate depth (at most `matched` tokens) and touches only
//     the entries no deeper than `matched`, where the reference hashed the prefix from scratch
//     once per entry (O(entries × depth)). BenchmarkLookupTiered measures both.
//
// Decisions (CONTRACT.md, "Decisions"): the slot being registered is never reported as displaced
// (the reference handed it back when the same slot was re-registered for the same key, and the
// caller freed a live slot; a tail sweep likewise skips an entry holding the new slot); promote on a resident entry answers false and changes nothing (the
// reference overwrote and leaked the live slot); a negative slot or token count is invalid input
// and changes nothing. Everything else is at parity, including the documented leaks and quirks:
// a tail sweep or an overwrite of a spilled entry orphans its tier blob (the index has no handle
// on the store; the engine reaps via forgetTiered), a tail registered with session 0 is kept but
// can never be restored, tail inserts do not count saves, and the legacy eviction path does not
// advance evictionsSinceLookup.

// SnapshotStats are the index counters. They only ever grow. Misses are
// Lookups − Hits.
type SnapshotStats struct {
	Saves                 uint64 // entries pushed by plain and sibling inserts (not tail inserts)
	Lookups               uint64 // index lookups (only tree hits consult the index)
	Hits                  uint64 // lookups that found an anchor
	AnchorDepthSum        uint64 // sum of the winning anchors' depths
	RecomputeTokensOnHit  uint64 // sum of matched − depth over hits
	RecomputeTokensOnMiss uint64 // sum of matched over misses
	Evictions             uint64 // entries removed by LRU, slot and tier-drop evictions
	TierSpills            uint64 // entries marked spilled
	TierHits              uint64 // hits whose winner is spilled
	TierFaultIns          uint64 // successful promotes
	TierReaps             uint64 // successful forgets
}

// snapEntry is one snapshot (CONTRACT.md, "Entries and keys").
type snapEntry struct {
	slot          int    // resident pool slot; stale while tiered
	session       uint64 // session that registered it (0: none)
	tokenCount    int    // depth: the number of tokens key was computed over
	key           uint64 // prefixHash(tokens, tokenCount, adapter)
	lastAccess    uint64 // index clock at the last insert or winning lookup
	tiered        bool   // spilled under key; slot already handed back
	isTail        bool   // a mid-chunk tail capture (session-gated, leased)
	isTailSibling bool   // the capture one block below the tail (leased)
}

// snapKind is the flavour of an insert, which sets the entry's kind flags (invariant 15).
type snapKind uint8

const (
	snapPlain snapKind = iota
	snapTail
	snapSibling
)

// snapMatch is a lookupTiered hit: the winner's depth and location.
type snapMatch struct {
	tokenCount int    // the anchor's depth, <= matched
	slot       int    // resident slot; -1 when tiered
	tierKey    uint64 // tier key when tiered, else 0
	tiered     bool   // the anchor is spilled: fault it in from the tier under tierKey
	isTail     bool   // the anchor is a tail capture
}

// depthKey locates an entry in byDepth.
type depthKey struct {
	depth int
	key   uint64
	idx   int // index into entries
}

// snapshotIndex is the SSM snapshot index. All methods take mu themselves; methods whose names
// end in Locked expect the caller to hold it.
type snapshotIndex struct {
	mu sync.Mutex // guards everything below

	hermetic bool    // the session gate confines every entry (Options.Hermetic)
	leaseOff bool    // no tail lease (Options.DisableTailLease)
	leaseTTL uint32  // evictions a lease survives without a lookup from its session
	alpha    float64 // depth weight in victim scores, in [0, 8]
	legacy   bool    // evictLRU uses plain per-entry LRU (Options.LegacySnapshotEviction)

	entries []snapEntry
	byKey   map[uint64]int // key → index into entries
	byDepth []depthKey     // one per entry, sorted by (depth, key)

	clock                uint64 // the index's own access clock
	lastLookupSession    uint64 // session of the latest lookup with a nonzero session
	evictionsSinceLookup uint32 // saturating; renewed by every nonzero-session lookup
	stats                SnapshotStats

	sessIdx map[uint64]int  // victim-choice scratch: session → index into sess
	sess    []victimSession // victim-choice scratch, one per session with eligible entries
}

// maxSnapshotEvictAlpha is the reference's clamp on the depth weight: beyond 8 depth swamps
// recency so completely that a session's stale deep entries would never leave.
const maxSnapshotEvictAlpha = 8

func newSnapshotIndex(opts Options) *snapshotIndex {
	alpha := opts.SnapshotEvictAlpha
	if math.IsNaN(alpha) {
		alpha = 0
	}
	alpha = min(max(alpha, 0), maxSnapshotEvictAlpha)
	ttl := opts.TailLeaseTTL
	if ttl == 0 {
		ttl = DefaultTailLeaseTTL
	}
	return &snapshotIndex{
		hermetic: opts.Hermetic,
		leaseOff: opts.DisableTailLease,
		leaseTTL: ttl,
		alpha:    alpha,
		legacy:   opts.LegacySnapshotEviction,
		byKey:    make(map[uint64]int),
		sessIdx:  make(map[uint64]int),
	}
}

// lookupTiered is the serving lookup (CONTRACT.md, "Serving lookup"): the deepest anchor no deeper than matched whose
// key is the prompt's prefix hash at its depth and which the session gate lets through, resident
// or spilled. A nonzero session is latched and renews its tail lease, hit or miss. Only the
// winner's recency is bumped. Depths beyond len(tokens) cannot be hashed and
// never match; matched < 0 counts as 0.
func (x *snapshotIndex) lookupTiered(tokens []uint32, matched int, session, adapter uint64) (snapMatch, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	i, ok := x.lookupLocked(tokens, matched, session, adapter, false)
	if !ok {
		return snapMatch{}, false
	}
	e := &x.entries[i]
	m := snapMatch{tokenCount: e.tokenCount, slot: e.slot, isTail: e.isTail}
	if e.tiered {
		m.slot, m.tierKey, m.tiered = -1, e.key, true
	}
	return m, true
}

// lookupResident is the reference's resident-only lookup (test-only there): lookupTiered with
// spilled entries skipped, same latch, stats and recency. Kept so the index tests of the reference's
// snapshot_index.rs can exercise both variants through the one gate.
func (x *snapshotIndex) lookupResident(tokens []uint32, matched int, session, adapter uint64) (slot, depth int, ok bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	i, ok := x.lookupLocked(tokens, matched, session, adapter, true)
	if !ok {
		return 0, 0, false
	}
	return x.entries[i].slot, x.entries[i].tokenCount, true
}

func (x *snapshotIndex) lookupLocked(tokens []uint32, matched int, session, adapter uint64, residentOnly bool) (int, bool) {
	if session != 0 {
		x.lastLookupSession = session
		x.evictionsSinceLookup = 0
	}
	limit := min(matched, len(tokens))
	best := -1
	h, pos := prefixHashSeed(adapter), 0
	for _, dk := range x.byDepth {
		if dk.depth > limit {
			break
		}
		if dk.depth > pos {
			h = prefixHashExtend(h, tokens[pos:dk.depth])
			pos = dk.depth
		}
		if dk.key != h {
			continue
		}
		e := &x.entries[dk.idx]
		if residentOnly && e.tiered {
			continue
		}
		if sessionGateBlocks(e, session, x.hermetic) {
			continue
		}
		best = dk.idx // ascending depth: a later candidate is deeper
	}
	mt := uint64(max(matched, 0))
	x.stats.Lookups++
	if best < 0 {
		x.stats.RecomputeTokensOnMiss += mt
		return -1, false
	}
	e := &x.entries[best]
	x.clock++
	e.lastAccess = x.clock
	d := uint64(e.tokenCount)
	x.stats.Hits++
	x.stats.AnchorDepthSum += d
	if mt > d {
		x.stats.RecomputeTokensOnHit += mt - d
	}
	if e.tiered {
		x.stats.TierHits++
	}
	return best, true
}

// insert is the plain insert (CONTRACT.md, "Snapshot inserts"), used for finish leaves and intermediate anchors. It
// returns the displaced resident slot, if any, for the caller to free.
func (x *snapshotIndex) insert(key uint64, slot int, session uint64, tokenCount int) (displaced int, ok bool) {
	if slot < 0 || tokenCount < 0 {
		return 0, false
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.upsertLocked(key, slot, session, tokenCount, snapPlain)
}

// insertTail registers the session's tail capture. A nonzero session first sweeps
// its previous tail and sibling, so it keeps at most one of each (invariant 16). It returns every
// resident slot it displaced; a swept spilled entry returns nothing (its slot was handed back at
// spill time) and its tier blob is orphaned.
func (x *snapshotIndex) insertTail(key uint64, slot int, session uint64, tokenCount int) []int {
	if slot < 0 || tokenCount < 0 {
		return nil
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	var out []int
	if session != 0 {
		for i := 0; i < len(x.entries); {
			e := &x.entries[i]
			if (e.isTail || e.isTailSibling) && e.session == session {
				if !e.tiered && e.slot != slot {
					out = append(out, e.slot)
				}
				x.removeLocked(i) // swap-remove: re-examine index i
				continue
			}
			i++
		}
	}
	if d, ok := x.upsertLocked(key, slot, session, tokenCount, snapTail); ok {
		out = append(out, d)
	}
	return out
}

// insertTailSibling registers the capture one block below the tail. It does not
// sweep: call it after insertTail for the same capture, whose sweep removed the old sibling.
func (x *snapshotIndex) insertTailSibling(key uint64, slot int, session uint64, tokenCount int) (displaced int, ok bool) {
	if slot < 0 || tokenCount < 0 {
		return 0, false
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.upsertLocked(key, slot, session, tokenCount, snapSibling)
}

// upsertLocked overwrites key's entry (which becomes resident with the kind's flags: CONTRACT.md,
// "Resident and spilled")
// or pushes a new one. It returns the old slot if the entry was resident on another slot.
func (x *snapshotIndex) upsertLocked(key uint64, slot int, session uint64, tokenCount int, kind snapKind) (int, bool) {
	x.clock++
	if i, found := x.byKey[key]; found {
		e := &x.entries[i]
		old, displaced := e.slot, !e.tiered && e.slot != slot
		if e.tokenCount != tokenCount {
			x.moveDepthLocked(i, tokenCount)
		}
		e.slot, e.session, e.tokenCount = slot, session, tokenCount
		e.tiered, e.isTail, e.isTailSibling = false, kind == snapTail, kind == snapSibling
		e.lastAccess = x.clock
		if displaced {
			return old, true
		}
		return 0, false
	}
	if kind != snapTail {
		x.stats.Saves++ // parity: tail pushes are not counted
	}
	x.pushLocked(snapEntry{
		slot: slot, session: session, tokenCount: tokenCount, key: key, lastAccess: x.clock,
		isTail: kind == snapTail, isTailSibling: kind == snapSibling,
	})
	return 0, false
}

// evictLRU removes a resident victim (CONTRACT.md, "Snapshot eviction") and returns its slot; false when every entry is
// spilled or there is none.
func (x *snapshotIndex) evictLRU() (int, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if len(x.entries) == 0 {
		return 0, false
	}
	var i int
	if x.legacy {
		i = x.legacyVictimLocked()
	} else {
		i = x.victimLocked(x.tailLeaseActiveLocked(), true)
	}
	if i < 0 {
		return 0, false
	}
	slot := x.entries[i].slot
	x.removeLocked(i)
	x.stats.Evictions++
	if !x.legacy { // parity: the legacy path does not shorten the lease
		x.bumpEvictionsSinceLookupLocked()
	}
	return slot, true
}

// evictSlot removes the first resident entry on slot, without consulting the lease:
// the caller chose the victim itself. A spilled entry's slot is stale and never matches.
func (x *snapshotIndex) evictSlot(slot int) bool {
	if slot < 0 {
		return false
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	for i := range x.entries {
		if e := &x.entries[i]; !e.tiered && e.slot == slot {
			x.removeLocked(i)
			x.stats.Evictions++
			x.bumpEvictionsSinceLookupLocked()
			return true
		}
	}
	return false
}

// evictToTier frees a resident victim's slot: an entry at least minTokens deep (any
// depth when minTokens <= 0) stays findable as spilled under its key; a shallower one is dropped,
// so no warm turn pays a blob-sized read that costs more than the recompute.
func (x *snapshotIndex) evictToTier(minTokens int) (TierEvict, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if len(x.entries) == 0 {
		return TierEvict{}, false
	}
	i := x.victimLocked(x.tailLeaseActiveLocked(), true)
	if i < 0 {
		return TierEvict{}, false
	}
	x.bumpEvictionsSinceLookupLocked()
	e := &x.entries[i]
	if minTokens > 0 && e.tokenCount < minTokens {
		te := TierEvict{Slot: e.slot, Depth: e.tokenCount}
		x.removeLocked(i)
		x.stats.Evictions++
		return te, true
	}
	e.tiered = true
	x.stats.TierSpills++
	return TierEvict{Spill: true, Slot: e.slot, Key: e.key, Depth: e.tokenCount}, true
}

// promote makes a spilled entry resident at newSlot after the caller faulted its bytes in. A
// resident entry answers false and keeps its live slot (CONTRACT.md, "Decisions").
func (x *snapshotIndex) promote(key uint64, newSlot int) bool {
	if newSlot < 0 {
		return false
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	i, ok := x.byKey[key]
	if !ok || !x.entries[i].tiered {
		return false
	}
	x.entries[i].tiered, x.entries[i].slot = false, newSlot
	x.stats.TierFaultIns++
	return true
}

// forgetTiered removes a spilled entry whose blob is gone. It refuses a resident
// entry (its slot is live and this path could not hand it back) and does not count as an
// eviction: a reap frees no slot and must not shorten the lease.
func (x *snapshotIndex) forgetTiered(key uint64) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	i, ok := x.byKey[key]
	if !ok || !x.entries[i].tiered {
		return false
	}
	x.removeLocked(i)
	x.stats.TierReaps++
	return true
}

// count is the number of entries, spilled ones included.
func (x *snapshotIndex) count() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return len(x.entries)
}

func (x *snapshotIndex) snapshotStats() SnapshotStats {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.stats
}

func (x *snapshotIndex) bumpEvictionsSinceLookupLocked() {
	if x.evictionsSinceLookup < math.MaxUint32 {
		x.evictionsSinceLookup++
	}
}

// pushLocked appends e, whose key must not be present.
func (x *snapshotIndex) pushLocked(e snapEntry) {
	i := len(x.entries)
	x.entries = append(x.entries, e)
	x.byKey[e.key] = i
	x.insertDepthLocked(depthKey{depth: e.tokenCount, key: e.key, idx: i})
}

// removeLocked swap-removes entries[i]: the last entry moves into the gap, as in the reference,
// so list order (the victim tie-break) matches it.
func (x *snapshotIndex) removeLocked(i int) {
	e := x.entries[i]
	x.deleteDepthLocked(e.tokenCount, e.key)
	delete(x.byKey, e.key)
	last := len(x.entries) - 1
	if i != last {
		moved := x.entries[last]
		x.entries[i] = moved
		x.byKey[moved.key] = i
		if p, ok := x.depthPosLocked(moved.tokenCount, moved.key); ok {
			x.byDepth[p].idx = i
		}
	}
	x.entries[last] = snapEntry{}
	x.entries = x.entries[:last]
}

// moveDepthLocked re-files entries[i] under a new depth (an overwrite with another token count,
// possible only through a key collision or a caller-chosen key).
func (x *snapshotIndex) moveDepthLocked(i, depth int) {
	e := &x.entries[i]
	x.deleteDepthLocked(e.tokenCount, e.key)
	x.insertDepthLocked(depthKey{depth: depth, key: e.key, idx: i})
}

func cmpDepthKey(a depthKey, depth int, key uint64) int {
	if c := cmp.Compare(a.depth, depth); c != 0 {
		return c
	}
	return cmp.Compare(a.key, key)
}

func (x *snapshotIndex) depthPosLocked(depth int, key uint64) (int, bool) {
	return slices.BinarySearchFunc(x.byDepth, depthKey{depth: depth, key: key}, func(a, b depthKey) int {
		return cmpDepthKey(a, b.depth, b.key)
	})
}

func (x *snapshotIndex) insertDepthLocked(dk depthKey) {
	p, _ := x.depthPosLocked(dk.depth, dk.key)
	x.byDepth = slices.Insert(x.byDepth, p, dk)
}

func (x *snapshotIndex) deleteDepthLocked(depth int, key uint64) {
	if p, ok := x.depthPosLocked(depth, key); ok {
		x.byDepth = slices.Delete(x.byDepth, p, p+1)
	}
}
