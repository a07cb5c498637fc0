package local

import (
	"encoding/binary"
	"fmt"
	"testing"
)

// FuzzOps decodes a byte string into a configuration and an operation sequence for the model
// driver: results equal the model's, the invariants of CONTRACT.md and the summary hold after every step,
// and nothing panics.
func FuzzOps(f *testing.F) {
	f.Add([]byte{4, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10})
	f.Add([]byte{2, 0xff, 200, 30, 45, 60, 75, 90, 99, 21, 42, 84, 168, 1, 2, 3})
	f.Add([]byte{1, 4, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 96, 97, 98, 99, 0, 0, 0})
	f.Add([]byte("insert lookup release evict pin peek over-release drain"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 2 {
			return
		}
		cfg := driverConfig{
			bs:          1 + int(data[0]%8),
			hss:         data[1]&1 != 0,
			overRelease: data[1]&2 != 0,
			subBlock:    data[1]&4 != 0,
			mixed:       data[1]&8 != 0,
			maxBlocks:   40,
		}
		if data[1]&16 != 0 {
			cfg.journalCap = 8
		}
		src := &byteSource{b: data[2:]}
		d := newDriver(cfg, src, uint64(data[0]))
		for i := 0; i < 5000 && !src.done; i++ {
			if err := d.step(); err != nil {
				t.Fatalf("config %+v step %d: %v", cfg, i, err)
			}
		}
	})
}

// fuzzTree builds the fixture FuzzInvalidArgs mutates: a few prompts, some held, a partial, an
// over-released node, two adapters, and disk ids.
func fuzzTree() *RadixTree {
	tr := NewRadixTree(Options{SubBlockMatching: true})
	tr.Insert(toks(0, 40), []uint32{1, 2, 3}, []uint32{100, NoBlock, 102}, 16, 0, 0)
	tr.Insert(cat(toks(0, 16), toks(7, 23)), []uint32{1, 4}, nil, 16, 16, 0)
	tr.Release(cat(toks(0, 16), toks(7, 23)), 16, 0)
	tr.Insert(toks(0, 8), []uint32{5, 6}, nil, 4, 0, 3)
	tr.Release(toks(0, 8), 4, 3)
	tr.Release(toks(0, 8), 4, 3)
	tr.Lookup(toks(0, 32), 16, 0, 0)
	return tr
}

// dumpState renders everything the tree's behaviour depends on.
func dumpState(t *RadixTree) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return fmt.Sprintf("%v|%v|%v|%v|%d|%+v|%d|%v|%v|%v", t.nodes, t.freeNodes, t.roots, t.children, t.clock, t.hits,
		t.live, t.partials, t.heap, t.journal.Head())
}

func decodeU32s(b []byte) []uint32 {
	out := make([]uint32, 0, len(b)/4)
	for ; len(b) >= 4; b = b[4:] {
		out = append(out, binary.LittleEndian.Uint32(b))
	}
	return out
}

// FuzzInvalidArgs calls one method with arbitrary arguments: it never panics, invalid arguments
// change nothing, and valid ones leave the structure consistent.
func FuzzInvalidArgs(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3}, []byte{1, 0, 0, 0}, []byte{}, 16, 0, uint64(0), uint8(0))
	f.Add([]byte{0, 1, 2, 3}, []byte{1, 0, 0, 0}, []byte{}, 0, 0, uint64(0), uint8(0))
	f.Add([]byte{0, 1, 2, 3}, []byte{1, 0, 0, 0}, []byte{}, -5, 0, uint64(0), uint8(1))
	f.Add([]byte{0, 1, 2, 3}, []byte{0xff, 0xff, 0xff, 0xff}, []byte{}, 2, 0, uint64(0), uint8(0))
	f.Add([]byte{0, 1, 2, 3, 4}, []byte{1, 0, 0, 0, 2, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}, []byte{}, 2, 0, uint64(0), uint8(0))
	f.Add([]byte{0, 1, 2, 3}, []byte{1, 0, 0, 0, 2, 0, 0, 0}, []byte{9, 0, 0, 0}, 2, 0, uint64(0), uint8(0))
	f.Add([]byte{0, 1, 2, 3}, []byte{}, []byte{}, 1<<40, 1<<62, ^uint64(0), uint8(5))
	f.Add([]byte{}, []byte{}, []byte{}, -1, -1, uint64(3), uint8(6))
	f.Add([]byte{0, 1, 2, 3}, []byte{}, []byte{}, 4, -100, uint64(3), uint8(2))
	f.Fuzz(func(t *testing.T, tokB, btB, diskB []byte, blockSize, matched int, adapter uint64, op uint8) {
		tokens := make([]uint32, len(tokB))
		for i, b := range tokB {
			tokens[i] = uint32(b % 40)
		}
		bt, disks := decodeU32s(btB), decodeU32s(diskB)
		tr, twin := fuzzTree(), fuzzTree()
		valid := blockSize > 0
		switch op % 7 {
		case 0:
			valid = validInsert(tokens, bt, disks, blockSize)
			tr.Insert(tokens, bt, disks, blockSize, matched, adapter)
		case 1:
			tr.Lookup(tokens, blockSize, 0, adapter)
		case 2:
			tr.PeekMatchedTokens(tokens, blockSize, adapter)
			valid = false // never changes anything
		case 3:
			tr.PinPrefix(tokens, blockSize, adapter)
		case 4:
			tr.Release(tokens, blockSize, adapter)
		case 5:
			tr.ReleaseMatched(tokens, blockSize, matched, adapter)
		case 6:
			tr.Evict(blockSize)
		}
		if !valid && dumpState(tr) != dumpState(twin) {
			t.Fatalf("op %d with invalid arguments changed the tree", op%7)
		}
		if err := checkStructure(tr); err != nil {
			t.Fatal(err)
		}
		if err := newSummaryReplica().sync(tr); err != nil {
			t.Fatal(err)
		}
	})
}
