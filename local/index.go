package local

// hashIndex maps a node's chained block hash to its arena index: an open-addressing table with
// linear probing and backward-shift deletion (no tombstones). A slot packs the low 32 bits of the
// hash (the tag) with the node index, so a probe that passes over other entries compares tags in
// the table itself and touches the node array only on a tag match: profiles of the trace
// simulator showed the untagged table's reads of nodes[c].hash (a cache miss per probe) as a third
// of all CPU. A slot costs 8 bytes (11–21 bytes per node at the load factors below, against 20–40
// for a Go map[uint64]int32), and a probe does not rehash a key that is already a uniform 64-bit
// hash.
type hashIndex struct {
	slots []uint64 // emptySlot, or tag<<32 | node index; len is a power of two or 0
	n     int
}

// hashIndexMinSlots is the first table size; small trees stay small.
const hashIndexMinSlots = 16

// emptySlot marks a free slot; no real entry equals it because its node index would be noNode.
const emptySlot = ^uint64(0)

func packSlot(h uint64, c int32) uint64 { return h<<32 | uint64(uint32(c)) }
func slotNode(e uint64) int32           { return int32(uint32(e)) }
func slotTag(e uint64) uint64           { return e >> 32 }

func (x *hashIndex) len() int { return x.n }

// get returns the node filed under h, or noNode.
func (x *hashIndex) get(nodes []node, h uint64) int32 {
	if x.n == 0 {
		return noNode
	}
	mask := uint64(len(x.slots) - 1)
	tag := h & 0xFFFFFFFF
	for i := h & mask; ; i = (i + 1) & mask {
		e := x.slots[i]
		if e == emptySlot {
			return noNode
		}
		if slotTag(e) == tag {
			if c := slotNode(e); nodes[c].hash == h {
				return c
			}
		}
	}
}

// put files node c (whose hash is nodes[c].hash, not yet present) in the table.
func (x *hashIndex) put(nodes []node, c int32) {
	if (x.n+1)*4 > len(x.slots)*3 { // load factor ≤ 3/4: probes stay short
		x.grow()
	}
	x.place(packSlot(nodes[c].hash, c))
	x.n++
}

// place files a packed entry at the first free slot of its probe run. The home slot comes from
// the tag alone, which holds every bit the mask keeps (tables stay far below 2^32 slots).
func (x *hashIndex) place(e uint64) {
	mask := uint64(len(x.slots) - 1)
	i := slotTag(e) & mask
	for x.slots[i] != emptySlot {
		i = (i + 1) & mask
	}
	x.slots[i] = e
}

func (x *hashIndex) grow() {
	old := x.slots
	x.slots = make([]uint64, max(hashIndexMinSlots, 2*len(old)))
	for i := range x.slots {
		x.slots[i] = emptySlot
	}
	for _, e := range old {
		if e != emptySlot {
			x.place(e)
		}
	}
}

// del removes the entry for h (which must be present), shifting later entries of the probe run
// back so that no lookup stops early.
func (x *hashIndex) del(nodes []node, h uint64) {
	mask := uint64(len(x.slots) - 1)
	tag := h & 0xFFFFFFFF
	i := h & mask
	for {
		e := x.slots[i]
		if slotTag(e) == tag && nodes[slotNode(e)].hash == h {
			break
		}
		i = (i + 1) & mask
	}
	for j := (i + 1) & mask; x.slots[j] != emptySlot; j = (j + 1) & mask {
		home := slotTag(x.slots[j]) & mask
		// Move slots[j] into the hole at i unless its home lies cyclically in (i, j].
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			x.slots[i] = x.slots[j]
			i = j
		}
	}
	x.slots[i] = emptySlot
	x.n--
}
