package routing

import (
	"maps"
	"math/rand/v2"
	"testing"
)

// maskTable is what the index and the overlay need of a hash → node-bitmask table.
type maskTable interface {
	get(key uint64) uint64
	set(key, m uint64)
	del(key uint64)
	clearBit(bit uint64) int
	len() int
}

// TestBitTableMatchesMap: random sets, deletes and bit clears against a Go map, with keys drawn
// from a small range so probe chains collide, wrap around and shift back often.
func TestBitTableMatchesMap(t *testing.T) {
	testTableMatchesMap(t, func() maskTable { return &bitTable{} }, 64)
}

// TestBitTableFewBits: the same with few distinct bits, so masks hold several bits and clears
// leave most of them alive.
func TestBitTableFewBits(t *testing.T) {
	testTableMatchesMap(t, func() maskTable { return &bitTable{} }, 3)
}

func testTableMatchesMap(t *testing.T, newTable func() maskTable, nbits int) {
	rng := rand.New(rand.NewPCG(3, uint64(nbits)))
	for round := 0; round < 20; round++ {
		tb := newTable()
		ref := map[uint64]uint64{}
		keySpace := uint64(8 + rng.IntN(2000))
		for step := 0; step < 5000; step++ {
			k := rng.Uint64N(keySpace)
			if round%2 == 1 {
				k <<= 40 // keys that differ only in high bits
			}
			switch op := rng.IntN(10); {
			case op < 6:
				m := uint64(1) << rng.IntN(nbits)
				tb.set(k, tb.get(k)|m)
				ref[k] |= m
			case op < 8:
				tb.del(k)
				delete(ref, k)
			case op < 9:
				w := tb.get(k) &^ (uint64(1) << rng.IntN(4))
				tb.set(k, w)
				if w == 0 {
					delete(ref, k)
				} else {
					ref[k] = w
				}
			default:
				bit := uint64(1) << rng.IntN(nbits)
				want := 0
				for k, v := range ref {
					if v&bit != 0 {
						want++
						if v &^= bit; v == 0 {
							delete(ref, k)
						} else {
							ref[k] = v
						}
					}
				}
				if got := tb.clearBit(bit); got != want {
					t.Fatalf("round %d step %d: clearBit %d, want %d", round, step, got, want)
				}
			}
			if tb.len() != len(ref) {
				t.Fatalf("round %d step %d: len %d, want %d", round, step, tb.len(), len(ref))
			}
		}
		for k := uint64(0); k < keySpace; k++ {
			kk := k
			if round%2 == 1 {
				kk <<= 40
			}
			if tb.get(kk) != ref[kk] {
				t.Fatalf("round %d: key %d: %#x, want %#x", round, kk, tb.get(kk), ref[kk])
			}
		}
	}
}

// TestHoldTableMatchesMap: random count updates, deletes and slot drops of a holdTable against a
// Go map keyed by (hash, slot), with few hashes shared by many slots and few slots holding many
// hashes, so that pairs of one hash or one slot collide, probe chains wrap around the end of the
// table and deletions shift entries back across it.
func TestHoldTableMatchesMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 8))
	wrapped := 0
	for round := 0; round < 20; round++ {
		tb := &holdTable{}
		ref := map[pendingKey]int32{}
		hashSpace := uint64(1 + rng.IntN(300))
		slotSpace := int32(1 + rng.IntN(70))
		for step := 0; step < 6000; step++ {
			k := pendingKey{rng.Uint64N(hashSpace), rng.Int32N(slotSpace)}
			if round%2 == 1 {
				k.hash <<= 40 // hashes that differ only in high bits
			}
			switch op := rng.IntN(20); {
			case op < 12:
				n := ref[k] + 1
				tb.set(k, n)
				ref[k] = n
			case op < 16:
				n := max(ref[k]-1, 0)
				tb.set(k, n)
				if n == 0 {
					delete(ref, k)
				} else {
					ref[k] = n
				}
			case op < 19:
				tb.set(k, 0)
				delete(ref, k)
			default:
				want := map[uint64]int{}
				for p := range ref {
					if p.slot == k.slot {
						want[p.hash]++
						delete(ref, p)
					}
				}
				got := map[uint64]int{}
				tb.dropSlot(k.slot, func(h uint64) { got[h]++ })
				if !maps.Equal(got, want) {
					t.Fatalf("round %d step %d: dropSlot(%d) saw %v, want %v", round, step, k.slot, got, want)
				}
			}
			if tb.len() != len(ref) {
				t.Fatalf("round %d step %d: len %d, want %d", round, step, tb.len(), len(ref))
			}
			if got := tb.get(k); got != ref[k] {
				t.Fatalf("round %d step %d: %+v: count %d, want %d", round, step, k, got, ref[k])
			}
			wrapped += wrappedEntries(&tb.pairTable)
		}
		for h := uint64(0); h < hashSpace; h++ {
			for s := int32(0); s < slotSpace; s++ {
				k := pendingKey{h, s}
				if round%2 == 1 {
					k.hash <<= 40
				}
				if got := tb.get(k); got != ref[k] {
					t.Fatalf("round %d: %+v: count %d, want %d", round, k, got, ref[k])
				}
			}
		}
	}
	if wrapped == 0 {
		t.Fatal("no entry ever wrapped around the end of its table: the test misses that case")
	}
}

// wrappedEntries counts the entries stored before their home, past the end of the table.
func wrappedEntries(t *pairTable) int {
	n := 0
	for i, s := range t.slots {
		if s.val != 0 && uint64(i) < t.home(s.key) {
			n++
		}
	}
	return n
}

// TestHoldTablePairsNeverShareACount: the pairs of one hash on different slots are counted apart,
// and so are two pairs whose table keys (hash with the slot mixed in) are equal.
func TestHoldTablePairsNeverShareACount(t *testing.T) {
	tb := &holdTable{}
	a, b := pendingKey{42, 0}, pendingKey{42, 1}
	// c's key equals a's: only the slot word of the value tells them apart.
	c := pendingKey{42 ^ holdMix(0) ^ holdMix(7), 7}
	tb.set(a, 3)
	tb.set(b, 5)
	tb.set(c, 9)
	if ga, gb, gc := tb.get(a), tb.get(b), tb.get(c); ga != 3 || gb != 5 || gc != 9 {
		t.Fatalf("counts %d %d %d, want 3 5 9", ga, gb, gc)
	}
	tb.set(a, 0)
	if ga, gb, gc, n := tb.get(a), tb.get(b), tb.get(c), tb.len(); ga != 0 || gb != 5 || gc != 9 || n != 2 {
		t.Fatalf("after deleting a: counts %d %d %d, %d pairs, want 0 5 9, 2 pairs", ga, gb, gc, n)
	}
	var dropped []uint64
	tb.dropSlot(7, func(h uint64) { dropped = append(dropped, h) })
	if len(dropped) != 1 || dropped[0] != c.hash || tb.get(b) != 5 || tb.get(c) != 0 || tb.len() != 1 {
		t.Fatalf("dropSlot(7) saw %v, b %d, c %d, %d pairs; want [%d], 5, 0, 1 pair", dropped, tb.get(b), tb.get(c), tb.len(), c.hash)
	}
}
