package routing

import "math/bits"

// pairTable is the open-addressing hash table behind the index's and the overlay's hash → node
// bitmask tables (bitTable) and the overlay's (hash, slot) → hold count table (holdTable): linear
// probing and backward-shift deletion (Knuth, TAOCP vol. 3, section 6.4, Algorithm R), so there
// are no tombstones and probe sequences stay short under churn. A slot is 16 bytes, a key and a
// value side by side (one cache line per probe), and a zero value marks it empty. An entry is
// identified by its key and the bits of its value under an id mask that callers pass as a
// constant: none for bitTable (key the hash, value its node mask, never zero because the index
// deletes a hash when its last node bit goes), the high word for holdTable (slot there, count in
// the low word). Only the key picks the home slot, so moving and rehashing entries never looks
// at the id. The table's size is any number of slots, not a power of two: a key's home is the
// high word of (mixed key × size) (Lemire, "Fast random integer generation in an interval",
// 2019), so the table grows by an eighth at a time and its fill stays between 7/9 and 7/8 — 14.1
// bytes per (block, node) pair measured on the benchmark fleet, 16.4 per (key, node) on the tiered
// one, instead of the 21 a doubling table averaged (BenchmarkIndexBytesPerPair, …Tiers). It replaces map[uint64]uint64 in the Index (the same
// lookups at two thirds of the memory or less and no per-lookup hashing of the key beyond two
// multiplies) and a map keyed by (hash, slot) in the overlay. The id mask is a parameter, not a
// field, a method or a type parameter, so that inlined lookups fold it away. Not safe for
// concurrent use.
type pairTable struct {
	slots []tableSlot
	n     int // occupied slots
}

type tableSlot struct {
	key, val uint64
}

// tableMinSlots is the smallest non-empty table; tableMaxLoad (7/8) the fill that triggers
// growth by tableGrowNum/tableGrowDen: linear probing with random keys needs ~1/(2(1−α)²)
// probes for a miss, 32 at 7/8, but most lookups in an estimate hit, at ~(1 + 1/(1−α))/2 =
// 4.5 probes in the same cache line pair, and an estimate misses at most once (its walk ends
// there). Growing by 9/8 keeps the fill at or above 7/9 after a growth; each growth moves every
// entry, so an entry is moved about eight times over a table's growth from empty, a cost paid
// while summaries first arrive, not in steady state.
const (
	tableMinSlots   = 16
	tableMaxLoadNum = 7
	tableMaxLoadDen = 8
	tableGrowNum    = 9
	tableGrowDen    = 8
)

// home is the slot a key hashes to. Block hashes are already uniform, but tests and adversaries
// use small integers, so a Fibonacci multiply spreads them before the range reduction.
func (t *pairTable) home(key uint64) uint64 {
	hi, _ := bits.Mul64(key*0x9E3779B97F4A7C15, uint64(len(t.slots)))
	return hi
}

// next is the slot after i, wrapping around.
func (t *pairTable) next(i uint64) uint64 {
	if i++; i == uint64(len(t.slots)) {
		return 0
	}
	return i
}

// dist is how far slot j is past slot i, cyclically.
func (t *pairTable) dist(i, j uint64) uint64 {
	if j >= i {
		return j - i
	}
	return j + uint64(len(t.slots)) - i
}

func (t *pairTable) len() int { return t.n }

// lookup returns the value of the entry (key, id), 0 when absent. id has no bits outside idMask.
// It is written to stay within the compiler's inlining budget together with bitTable.get (cost
// 78 of 80 with Go 1.26: go build -gcflags=-m=2 ./routing), so that an estimate's lookups are
// inlined with idMask 0 folded away; a call per lookup costs the front door's decision ~4% more
// instructions (BenchmarkPickDecision/8k/overlay).
func (t *pairTable) lookup(key, id, idMask uint64) (val uint64) {
	if t.n == 0 {
		return
	}
	for i := t.home(key); ; {
		s := &t.slots[i]
		if s.val == 0 || s.key == key && s.val&idMask == id {
			return s.val
		}
		if i++; i == uint64(len(t.slots)) {
			i = 0
		}
	}
}

// full reports whether one more entry needs a larger table.
func (t *pairTable) full() bool { return (t.n+1)*tableMaxLoadDen > len(t.slots)*tableMaxLoadNum }

// grownSize is the slot count of the next growth.
func (t *pairTable) grownSize() int {
	return max(len(t.slots)*tableGrowNum/tableGrowDen, tableMinSlots)
}

// growBytes is what storing one more entry would add to the footprint: the growth, when full.
func (t *pairTable) growBytes() int64 {
	if !t.full() {
		return 0
	}
	return int64(t.grownSize()-len(t.slots)) * 16
}

// put stores id|rest as the value of the entry (key, id); rest has no bits under idMask, and 0
// deletes the entry.
func (t *pairTable) put(key, id, rest, idMask uint64) {
	if t.n > 0 {
		for i := t.home(key); ; i = t.next(i) {
			s := &t.slots[i]
			if s.val == 0 {
				break
			}
			if s.key == key && s.val&idMask == id {
				if rest == 0 {
					t.removeAt(i)
				} else {
					s.val = id | rest
				}
				return
			}
		}
	}
	if rest == 0 {
		return
	}
	if t.full() {
		t.grow()
	}
	t.insert(tableSlot{key, id | rest})
	t.n++
}

// insert places s in the first free slot from its home; the table has one.
func (t *pairTable) insert(s tableSlot) {
	i := t.home(s.key)
	for t.slots[i].val != 0 {
		i = t.next(i)
	}
	t.slots[i] = s
}

// removeAt empties slot i and shifts back the entries after it that probed past it, so that every
// entry stays reachable from its home without tombstones.
func (t *pairTable) removeAt(i uint64) {
	for j := t.next(i); ; j = t.next(j) {
		s := t.slots[j]
		if s.val == 0 {
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

// grow moves every entry into a table an eighth larger.
func (t *pairTable) grow() {
	old := t.slots
	t.slots = make([]tableSlot, t.grownSize())
	for _, s := range old {
		if s.val != 0 {
			t.insert(s)
		}
	}
}

// sweep takes the bits drop out of the value of every entry whose value has the bits want under
// sel, deleting entries left empty, calls f (when not nil) with each such entry's key, and returns
// how many there were. drop is either every bit or none under the id mask, so that no entry that
// stays changes its identity, and f must not change the table. Entries only ever shift backwards into the slot being re-examined or
// into slots not yet visited (or, across the wrap, already-swept ones), so one forward pass sees
// each entry once.
func (t *pairTable) sweep(sel, want, drop uint64, f func(key uint64)) int {
	swept := 0
	for i := 0; i < len(t.slots); {
		s := &t.slots[i]
		if s.val == 0 || s.val&sel != want {
			i++
			continue
		}
		swept++
		if f != nil {
			f(s.key)
		}
		if s.val &^= drop; s.val != 0 {
			i++
			continue
		}
		t.removeAt(uint64(i))
	}
	return swept
}

// reset empties the table, keeping its memory.
func (t *pairTable) reset() {
	if t.n > 0 {
		clear(t.slots)
		t.n = 0
	}
}

// bytes is the table's heap footprint.
func (t *pairTable) bytes() int64 { return int64(len(t.slots)) * 16 }

// bitTable maps a block hash to a non-zero 64-bit node bitmask (a pairTable with no id bits).
type bitTable struct{ pairTable }

// get returns key's mask, 0 when absent.
func (t *bitTable) get(key uint64) uint64 { return t.lookup(key, 0, 0) }

// set stores a mask for key; a zero mask deletes it.
func (t *bitTable) set(key, m uint64) { t.put(key, 0, m, 0) }

// del removes key if present.
func (t *bitTable) del(key uint64) { t.put(key, 0, 0, 0) }

// clearBit clears bit in every mask, deleting entries left empty, and returns how many masks
// had it.
func (t *bitTable) clearBit(bit uint64) int { return t.sweep(bit, bit, bit, nil) }
