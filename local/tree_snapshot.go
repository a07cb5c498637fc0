package local

// The RadixTree's snapshot methods (spec §2.9–2.12, §2.16–2.21). Each takes only the snapshot
// index's lock; InsertWithSnapshot runs the tree insert first, under the tree lock alone, and then
// registers the snapshot (spec §1.1: no method holds both locks). Displaced slots are the
// caller's to free (spec §6.3); the slot being registered is never among them.

// InsertWithSnapshot inserts the sequence's blocks (spec §2.8) and registers the SSM snapshot in
// slot snapshotID as the state after all len(tokens) tokens (a plain insert, spec §3.6). Invalid
// tree arguments (see Insert) or a negative slot do nothing and return the empty result.
func (t *RadixTree) InsertWithSnapshot(tokens, blockTable, diskBlockIDs []uint32, blockSize, snapshotID int, sessionHash uint64, matchedTokens int, adapterID uint64) (displaced int, ok bool, acq InsertAcquired) {
	if snapshotID < 0 || !validInsert(tokens, blockTable, diskBlockIDs, blockSize) {
		return 0, false, InsertAcquired{}
	}
	acq = t.Insert(tokens, blockTable, diskBlockIDs, blockSize, matchedTokens, adapterID)
	displaced, ok = t.snap.insert(prefixHash(tokens, len(tokens), adapterID), snapshotID, sessionHash, len(tokens))
	return displaced, ok, acq
}

// InsertIntermediateSnapshot registers an anchor at len(tokens) without touching the tree (spec
// §2.10): blockTable, diskBlockIDs, blockSize and matchedTokens are ignored, as in the reference.
func (t *RadixTree) InsertIntermediateSnapshot(tokens, blockTable, diskBlockIDs []uint32, blockSize, snapshotID int, sessionHash uint64, matchedTokens int, adapterID uint64) (displaced int, ok bool) {
	return t.snap.insert(prefixHash(tokens, len(tokens), adapterID), snapshotID, sessionHash, len(tokens))
}

// InsertTailSnapshot registers the session's tail capture (spec §2.11, §3.7), index only, and
// returns every resident slot it displaced (the session's previous tail and sibling included).
func (t *RadixTree) InsertTailSnapshot(tokens []uint32, snapshotID int, sessionHash, adapterID uint64) []int {
	return t.snap.insertTail(prefixHash(tokens, len(tokens), adapterID), snapshotID, sessionHash, len(tokens))
}

// InsertTailSiblingSnapshot registers the capture one block below the tail (spec §2.12, §3.8).
// Call it after InsertTailSnapshot for the same capture.
func (t *RadixTree) InsertTailSiblingSnapshot(tokens []uint32, snapshotID int, sessionHash, adapterID uint64) (displaced int, ok bool) {
	return t.snap.insertTailSibling(prefixHash(tokens, len(tokens), adapterID), snapshotID, sessionHash, len(tokens))
}

// EvictSnapshotLRU removes a resident snapshot chosen by spec §3.9 and returns its slot.
func (t *RadixTree) EvictSnapshotLRU() (slot int, ok bool) { return t.snap.evictLRU() }

// EvictSnapshotSlot removes the resident snapshot in slot, which the caller chose (spec §2.17).
func (t *RadixTree) EvictSnapshotSlot(slot int) bool { return t.snap.evictSlot(slot) }

// EvictSnapshotToTier frees a resident snapshot's slot, spilling it or dropping it if shallower
// than minTokens (spec §3.10).
func (t *RadixTree) EvictSnapshotToTier(minTokens int) (TierEvict, bool) {
	return t.snap.evictToTier(minTokens)
}

// PromoteSnapshot makes the spilled snapshot under key resident in newSlot after a fault-in
// (spec §3.11). It answers false, changing nothing, for an unknown key or a resident entry.
func (t *RadixTree) PromoteSnapshot(key uint64, newSlot int) bool {
	return t.snap.promote(key, newSlot)
}

// ForgetSnapshotTierKey removes the spilled snapshot under key whose blob is gone (spec §3.12).
// Remove the blob only when it answers true.
func (t *RadixTree) ForgetSnapshotTierKey(key uint64) bool { return t.snap.forgetTiered(key) }

// SnapshotCount is the number of snapshot entries, spilled ones included.
func (t *RadixTree) SnapshotCount() int { return t.snap.count() }

// SnapshotStats returns the snapshot index counters (spec §3.3).
func (t *RadixTree) SnapshotStats() SnapshotStats { return t.snap.snapshotStats() }
