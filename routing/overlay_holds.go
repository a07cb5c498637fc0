package routing

// holdTable counts the pending requests holding each (hash, slot) pair of the overlay: a
// pairTable whose key is the hash with the slot mixed in (so that one hash's pairs on many nodes
// spread over the table) and whose value carries the slot in its high word, part of the entry's
// identity so that two pairs never share a count, and the count in its low word (never zero: a
// zero count deletes). It replaces a Go map whose per-operation cost dominated Begin and End on
// long prompts. Not safe for concurrent use.
type holdTable struct{ pairTable }

// holdIDMask selects the slot word of a holdTable value.
const holdIDMask = 0xFFFFFFFF00000000

// holdID is slot's word of a holdTable value.
func holdID(slot int32) uint64 { return uint64(uint32(slot)) << 32 }

// holdMix is what a pair's key has xored into its hash: xoring it again gives the hash back.
func holdMix(slot int32) uint64 { return uint64(slot) * 0xBF58476D1CE4E5B9 }

// get returns k's count, 0 when absent.
func (t *holdTable) get(k pendingKey) int32 {
	return int32(uint32(t.lookup(k.hash^holdMix(k.slot), holdID(k.slot), holdIDMask)))
}

// set stores k's count; 0 deletes it.
func (t *holdTable) set(k pendingKey, n int32) {
	t.put(k.hash^holdMix(k.slot), holdID(k.slot), uint64(uint32(n)), holdIDMask)
}

// dropSlot deletes every pair of slot and calls f with each hash.
func (t *holdTable) dropSlot(slot int32, f func(hash uint64)) {
	mix := holdMix(slot)
	t.sweep(holdIDMask, holdID(slot), ^uint64(0), func(key uint64) { f(key ^ mix) })
}
