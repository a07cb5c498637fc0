package routing

import (
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
