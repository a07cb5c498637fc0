package routing

import (
	"testing"
)

// FuzzIndexOps decodes arbitrary bytes into a sequence of index operations (snapshots, deltas
// with any epoch and sequence numbers, removals) over a small hash and node space, applies them to
// the Index and to the naive reference, and checks every observable after each one. The package
// decodes nothing from the network itself (cluster/ decodes gossip into ApplyDelta calls), so
// this is the input surface that matters: any sequence of calls must keep the index exact.
func FuzzIndexOps(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte{0, 0, 0, 0x12, 0x34, 1, 0, 0, 1, 0x81, 0x01, 3, 0})
	f.Add([]byte{0, 1, 1, 5, 1, 2, 3, 4, 5, 1, 1, 1, 0, 2, 3, 0x83, 0x03, 2, 1})
	chains := [][]uint64{{1, 2, 3, 4, 5, 6, 7, 8}, {1, 2, 3, 9, 10, 11}, {12, 13, 14}}
	ids := []string{"a", "b", "c", "d", "ghost"}
	f.Fuzz(func(t *testing.T, data []byte) {
		next := func() int {
			if len(data) == 0 {
				return 0
			}
			b := data[0]
			data = data[1:]
			return int(b)
		}
		max := 4 + next()%40
		x, r := NewIndex(IndexConfig{MaxPairs: max}), newRefIndex(max)
		for steps := 0; len(data) > 0 && steps < 200; steps++ {
			id := ids[next()%4]
			switch next() % 4 {
			case 0:
				epoch, seq := uint64(next()%3), uint64(next()%8)
				var hs []uint64
				for n := next() % 12; n > 0; n-- {
					hs = append(hs, uint64(1+next()%16))
				}
				x.ReplaceNode(id, epoch, seq, hs)
				r.replace(id, epoch, seq, hs)
			case 1:
				x.RemoveNode(id)
				r.removeNode(id)
			default:
				epoch, from := uint64(next()%3), uint64(next()%10)
				to := from + uint64(next()%4) - 1 // sometimes inverted
				var ev []Change
				for n := next() % 8; n > 0; n-- {
					b := next()
					ev = append(ev, Change{Hash: uint64(1 + b%16), Added: b&0x80 == 0})
				}
				err, want := x.ApplyDelta(id, epoch, from, to, ev), r.apply(id, epoch, from, to, ev)
				if !sameErr(err, want) {
					t.Fatalf("ApplyDelta(%s, %d, %d, %d): %v, want %v", id, epoch, from, to, err, want)
				}
			}
			if err := compareIndex(x, r, chains, ids); err != nil {
				t.Fatal(err)
			}
		}
	})
}
