package local

// hashIndex maps a node's chained block hash to its arena index: an open-addressing table of
// int32 slots with linear probing and backward-shift deletion (no tombstones). The key is not
// stored: it is the node's own hash field, which the caller reads anyway to confirm the match, so
// a slot costs 4 bytes (5–11 bytes per node at the load factors below, against 20–40 for a Go
// map[uint64]int32) and a probe does not rehash a key that is already a uniform 64-bit hash.
type hashIndex struct {
	slots []int32 // noNode = empty; len is a power of two or 0
	n     int
}

// hashIndexMinSlots is the first table size; small trees stay small.
const hashIndexMinSlots = 16

func (x *hashIndex) len() int { return x.n }

// get returns the node filed under h, or noNode.
func (x *hashIndex) get(nodes []node, h uint64) int32 {
	if x.n == 0 {
		return noNode
	}
	mask := uint64(len(x.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		c := x.slots[i]
		if c == noNode || nodes[c].hash == h {
			return c
		}
	}
}

// put files node c (whose hash is nodes[c].hash, not yet present) in the table.
func (x *hashIndex) put(nodes []node, c int32) {
	if (x.n+1)*4 > len(x.slots)*3 { // load factor ≤ 3/4: probes stay short
		x.grow(nodes)
	}
	x.place(nodes, c)
	x.n++
}

func (x *hashIndex) place(nodes []node, c int32) {
	mask := uint64(len(x.slots) - 1)
	i := nodes[c].hash & mask
	for x.slots[i] != noNode {
		i = (i + 1) & mask
	}
	x.slots[i] = c
}

func (x *hashIndex) grow(nodes []node) {
	old := x.slots
	x.slots = make([]int32, max(hashIndexMinSlots, 2*len(old)))
	for i := range x.slots {
		x.slots[i] = noNode
	}
	for _, c := range old {
		if c != noNode {
			x.place(nodes, c)
		}
	}
}

// del removes the entry for h (which must be present), shifting later entries of the probe run
// back so that no lookup stops early.
func (x *hashIndex) del(nodes []node, h uint64) {
	mask := uint64(len(x.slots) - 1)
	i := h & mask
	for nodes[x.slots[i]].hash != h {
		i = (i + 1) & mask
	}
	for j := (i + 1) & mask; x.slots[j] != noNode; j = (j + 1) & mask {
		home := nodes[x.slots[j]].hash & mask
		// Move slots[j] into the hole at i unless its home lies cyclically in (i, j].
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			x.slots[i] = x.slots[j]
			i = j
		}
	}
	x.slots[i] = noNode
	x.n--
}
