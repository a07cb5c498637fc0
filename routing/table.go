package routing

import "math/bits"

// bitTable maps a block hash to a non-zero 64-bit node bitmask: an open-addressing hash table
// with linear probing and backward-shift deletion (Knuth, TAOCP vol. 3, section 6.4, Algorithm R), so
// there are no tombstones and probe sequences stay short under churn. A slot is 16 bytes (key and
// mask side by side, one cache line per probe) and a zero mask marks it empty, which is free
// because the index deletes a hash when its last node bit goes. The table's size is any number
// of slots, not a power of two: a key's home is the high word of (mixed key × size) (Lemire,
// "Fast random integer generation in an interval", 2019), so the table grows by a quarter at a
// time and its fill stays between 7/10 and 7/8 — 14 to 17 bytes per (block, node) pair on the
// benchmark fleet instead of the 21 a doubling table averaged (BenchmarkIndexBytesPerPair). It
// replaces map[uint64]uint64 in the Index: the same lookups at two thirds of the memory or less
// and no per-lookup hashing of the key beyond two multiplies. Not safe for concurrent use.
type bitTable struct {
	slots []tableSlot
	n     int // occupied slots
}

type tableSlot struct {
	key, mask uint64
}

// tableMinSlots is the smallest non-empty table; tableMaxLoad (7/8) the fill that triggers
// growth by tableGrowNum/tableGrowDen: linear probing with random keys needs ~1/(2(1−α)²)
// probes for a miss, 32 at 7/8, but most lookups in an estimate hit, at ~(1 + 1/(1−α))/2 =
// 4.5 probes in the same cache line pair, and an estimate misses at most once (its walk ends
// there). Growing by 5/4 keeps the fill at or above 7/10 after a growth.
const (
	tableMinSlots   = 16
	tableMaxLoadNum = 7
	tableMaxLoadDen = 8
	tableGrowNum    = 5
	tableGrowDen    = 4
)

// home is the slot a key hashes to. Block hashes are already uniform, but tests and adversaries
// use small integers, so a Fibonacci multiply spreads them before the range reduction.
func (t *bitTable) home(key uint64) uint64 {
	hi, _ := bits.Mul64(key*0x9E3779B97F4A7C15, uint64(len(t.slots)))
	return hi
}

// next is the slot after i, wrapping around.
func (t *bitTable) next(i uint64) uint64 {
	if i++; i == uint64(len(t.slots)) {
		return 0
	}
	return i
}

// dist is how far slot j is past slot i, cyclically.
func (t *bitTable) dist(i, j uint64) uint64 {
	if j >= i {
		return j - i
	}
	return j + uint64(len(t.slots)) - i
}

func (t *bitTable) len() int { return t.n }

// get returns key's mask, 0 when absent.
func (t *bitTable) get(key uint64) uint64 {
	if t.n == 0 {
		return 0
	}
	for i := t.home(key); ; i = t.next(i) {
		s := &t.slots[i]
		if s.mask == 0 {
			return 0
		}
		if s.key == key {
			return s.mask
		}
	}
}

// full reports whether one more key needs a larger table.
func (t *bitTable) full() bool { return (t.n+1)*tableMaxLoadDen > len(t.slots)*tableMaxLoadNum }

// grownSize is the slot count of the next growth.
func (t *bitTable) grownSize() int {
	return max(len(t.slots)*tableGrowNum/tableGrowDen, tableMinSlots)
}

// growBytes is what storing one more key would add to the footprint: the growth, when full.
func (t *bitTable) growBytes() int64 {
	if !t.full() {
		return 0
	}
	return int64(t.grownSize()-len(t.slots)) * 16
}

// set stores a mask for key; a zero mask deletes it.
func (t *bitTable) set(key, m uint64) {
	if m == 0 {
		t.del(key)
		return
	}
	if t.n > 0 {
		for i := t.home(key); ; i = t.next(i) {
			s := &t.slots[i]
			if s.mask == 0 {
				break
			}
			if s.key == key {
				s.mask = m
				return
			}
		}
	}
	if t.full() {
		t.grow()
	}
	i := t.home(key)
	for t.slots[i].mask != 0 {
		i = t.next(i)
	}
	t.slots[i] = tableSlot{key, m}
	t.n++
}

// del removes key if present.
func (t *bitTable) del(key uint64) {
	if t.n == 0 {
		return
	}
	for i := t.home(key); ; i = t.next(i) {
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
	for j := t.next(i); ; j = t.next(j) {
		s := t.slots[j]
		if s.mask == 0 {
			break
		}
		// s may move to i if i lies cyclically in [home(s), j).
		if t.dist(t.home(s.key), j) >= t.dist(i, j) {
			t.slots[i] = s
			i = j
		}
	}
	t.slots[i] = tableSlot{}
	t.n--
}

func (t *bitTable) grow() {
	old := t.slots
	t.slots = make([]tableSlot, t.grownSize())
	t.n = 0
	for _, s := range old {
		if s.mask == 0 {
			continue
		}
		i := t.home(s.key)
		for t.slots[i].mask != 0 {
			i = t.next(i)
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
