package routing

// bitTable maps a block hash to a non-zero 64-bit node bitmask: an open-addressing hash table
// with linear probing and backward-shift deletion (Knuth, TAOCP vol. 3, §6.4, Algorithm R), so
// there are no tombstones and probe sequences stay short under churn. A slot is 16 bytes (key and
// mask side by side, one cache line per probe) and a zero mask marks it empty, which is free
// because the index deletes a hash when its last node bit goes. It replaces map[uint64]uint64 in
// the Index: the same lookups at two thirds of the memory (BenchmarkIndexBytesPerPair) and no
// per-lookup hashing of the key beyond one multiply. Not safe for concurrent use.
type bitTable struct {
	slots []tableSlot // len is a power of two (or 0)
	n     int         // occupied slots
	shift uint        // 64 − log2(len(slots))
}

type tableSlot struct {
	key, mask uint64
}

// tableMinSlots is the smallest non-empty table; tableMaxLoad (7/8) the fill that triggers
// doubling: linear probing with random keys needs ~1/(2(1−α)²) probes for a miss, 32 at 7/8, but
// most lookups in an estimate hit, at ~(1 + 1/(1−α))/2 = 4.5 probes in the same cache line pair.
const (
	tableMinSlots   = 16
	tableMaxLoadNum = 7
	tableMaxLoadDen = 8
)

// home is the slot a key hashes to. Block hashes are already uniform, but tests and adversaries
// use small integers, so Fibonacci hashing (one multiply, top bits) spreads them.
func (t *bitTable) home(key uint64) uint64 {
	return (key * 0x9E3779B97F4A7C15) >> t.shift
}

func (t *bitTable) len() int { return t.n }

// get returns key's mask, 0 when absent.
func (t *bitTable) get(key uint64) uint64 {
	if t.n == 0 {
		return 0
	}
	mask := uint64(len(t.slots) - 1)
	for i := t.home(key); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.mask == 0 {
			return 0
		}
		if s.key == key {
			return s.mask
		}
	}
}

// set stores a mask for key; a zero mask deletes it.
func (t *bitTable) set(key, m uint64) {
	if m == 0 {
		t.del(key)
		return
	}
	if (t.n+1)*tableMaxLoadDen > len(t.slots)*tableMaxLoadNum {
		t.grow()
	}
	mask := uint64(len(t.slots) - 1)
	for i := t.home(key); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.mask == 0 {
			s.key, s.mask = key, m
			t.n++
			return
		}
		if s.key == key {
			s.mask = m
			return
		}
	}
}

// del removes key if present.
func (t *bitTable) del(key uint64) {
	if t.n == 0 {
		return
	}
	mask := uint64(len(t.slots) - 1)
	for i := t.home(key); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.mask == 0 {
			return
		}
		if s.key == key {
			t.removeAt(i)
			return
		}
	}
}

// removeAt empties slot i and shifts back the entries after it that probed past it, so that every
// entry stays reachable from its home without tombstones.
func (t *bitTable) removeAt(i uint64) {
	mask := uint64(len(t.slots) - 1)
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		s := t.slots[j]
		if s.mask == 0 {
			break
		}
		// s may move to i if i lies cyclically in [home(s), j).
		if (j-t.home(s.key))&mask >= (j-i)&mask {
			t.slots[i] = s
			i = j
		}
	}
	t.slots[i] = tableSlot{}
	t.n--
}

func (t *bitTable) grow() {
	old := t.slots
	size := max(2*len(old), tableMinSlots)
	t.slots = make([]tableSlot, size)
	t.shift = uint(64 - log2(size))
	t.n = 0
	mask := uint64(size - 1)
	for _, s := range old {
		if s.mask == 0 {
			continue
		}
		i := t.home(s.key)
		for t.slots[i].mask != 0 {
			i = (i + 1) & mask
		}
		t.slots[i] = s
		t.n++
	}
}

// clearBit clears bit in every mask, deleting entries left empty, and returns how many masks
// had it. Entries only ever shift backwards into the slot being re-examined or into slots not yet
// visited (or, across the wrap, already-cleared ones), so one forward pass sees each entry.
func (t *bitTable) clearBit(bit uint64) int {
	cleared := 0
	for i := 0; i < len(t.slots); {
		s := &t.slots[i]
		if s.mask&bit == 0 {
			i++
			continue
		}
		cleared++
		if s.mask &^= bit; s.mask != 0 {
			i++
			continue
		}
		t.removeAt(uint64(i))
	}
	return cleared
}

// reset empties the table, keeping its memory.
func (t *bitTable) reset() {
	if t.n > 0 {
		clear(t.slots)
		t.n = 0
	}
}

// bytes is the table's heap footprint.
func (t *bitTable) bytes() int64 { return int64(len(t.slots)) * 16 }

func log2(n int) int {
	k := 0
	for 1<<k < n {
		k++
	}
	return k
}
