package local

// The RadixTree's snapshot methods (CONTRACT.md, "The snapshot index"). Each takes only the snapshot
// index's lock; InsertWithSnapshot runs the tree insert first, under the tree lock alone, and then
// registers the snapshot (no method holds both locks). Displaced slots are the caller's to free
// (CONTRACT.md, "The caller's contract", item 3); the slot being registered is never among them.

// InsertWithSnapshot inserts the sequence's blocks (see Insert) and registers the SSM snapshot in
// slot snapshotID as the state after all len(tokens) tokens (a plain insert, CONTRACT.md, "Snapshot inserts"). Invalid
// tree arguments (see Insert) or a negative slot do nothing and return the empty result.
func (t *RadixTree) InsertWithSnapshot(tokens, blockTable, diskBlockIDs []uint32, blockSize, snapshotID int, sessionHash uint64, matchedTokens int, adapterID uint64) (displaced int, ok bool, acq InsertAcquired) {
	if snapshotID < 0 || !validInsert(tokens, blockTable, diskBlockIDs, blockSize) {
		return 0, false, InsertAcquired{}
	}
	acq = t.Insert(tokens, blockTable, diskBlockIDs, blockSize, matchedTokens, adapterID)
	displaced, ok = t.snap.insert(prefixHash(tokens, len(tokens), adapterID), snapshotID, sessionHash, len(tokens))
	return displaced, ok, acq
}

// InsertIntermediateSnapshot registers an anchor at len(tokens) without touching the tree:
// blockTable, diskBlockIDs, blockSize and matchedTokens are ignored, as in the reference.
func (t *RadixTree) InsertIntermediateSnapshot(tokens, blockTable, diskBlockIDs []uint32, blockSize, snapshotID int, sessionHash uint64, matchedTokens int, adapterID uint64) (displaced int, ok bool) {
	return t.snap.insert(prefixHash(tokens, len(tokens), adapterID), snapshotID, sessionHash, len(tokens))
}

// InsertTailSnapshot registers the session's tail capture, index only, and
// returns every resident slot it displaced (the session's previous tail and sibling included).
func (t *RadixTree) InsertTailSnapshot(tokens []uint32, snapshotID int, sessionHash, adapterID uint64) []int {
	return t.snap.insertTail(prefixHash(tokens, len(tokens), adapterID), snapshotID, sessionHash, len(tokens))
}

// InsertTailSiblingSnapshot registers the capture one block below the tail.
// Call it after InsertTailSnapshot for the same capture.
func (t *RadixTree) InsertTailSiblingSnapshot(tokens []uint32, snapshotID int, sessionHash, adapterID uint64) (displaced int, ok bool) {
	return t.snap.insertTailSibling(prefixHash(tokens, len(tokens), adapterID), snapshotID, sessionHash, len(tokens))
}

// EvictSnapshotLRU removes a resident snapshot chosen as CONTRACT.md, "Snapshot eviction" says,
// and returns its slot.
func (t *RadixTree) EvictSnapshotLRU() (slot int, ok bool) { return t.snap.evictLRU() }

// EvictSnapshotSlot removes the resident snapshot in slot, which the caller chose.
func (t *RadixTree) EvictSnapshotSlot(slot int) bool { return t.snap.evictSlot(slot) }

// EvictSnapshotToTier frees a resident snapshot's slot, spilling it or dropping it if shallower
// than minTokens (CONTRACT.md, "Snapshot eviction").
func (t *RadixTree) EvictSnapshotToTier(minTokens int) (TierEvict, bool) {
	return t.snap.evictToTier(minTokens)
}

// PromoteSnapshot makes the spilled snapshot under key resident in newSlot after a fault-in.
// It answers false, changing nothing, for an unknown key or a resident entry.
func (t *RadixTree) PromoteSnapshot(key uint64, newSlot int) bool {
	return t.snap.promote(key, newSlot)
}

// ForgetSnapshotTierKey removes the spilled snapshot under key whose blob is gone.
// Remove the blob only when it answers true.
func (t *RadixTree) ForgetSnapshotTierKey(key uint64) bool { return t.snap.forgetTiered(key) }

// SnapshotCount is the number of snapshot entries, spilled ones included.
func (t *RadixTree) SnapshotCount() int { return t.snap.count() }

// SnapshotStats returns the snapshot index counters.
func (t *RadixTree) SnapshotStats() SnapshotStats { return t.snap.snapshotStats() }
