package local

import (
	"encoding/binary"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// refHash is a byte-by-byte restatement of the definition in hash.go built on xxhash.Sum64 (one-shot), an
// independent path from ChainHash's streaming digest and unsafe byte view.
func refHash(tokens []uint32, bs int, adapter uint64) []uint64 {
	var out []uint64
	var prev uint64
	if adapter != 0 {
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], adapter)
		prev = xxhash.Sum64(b[:])
	}
	for i := 0; i+bs <= len(tokens); i += bs {
		buf := binary.LittleEndian.AppendUint64(nil, prev)
		for _, t := range tokens[i : i+bs] {
			buf = binary.LittleEndian.AppendUint32(buf, t)
		}
		prev = xxhash.Sum64(buf)
		out = append(out, prev)
	}
	return out
}

func seq(from, to uint32) []uint32 {
	out := make([]uint32, 0, to-from)
	for t := from; t < to; t++ {
		out = append(out, t)
	}
	return out
}

func TestBlockHashesFixedVectors(t *testing.T) {
	// Fixed vectors pin the wire-visible definition: a change here breaks every mixed-version cluster.
	cases := []struct {
		name    string
		tokens  []uint32
		bs      int
		adapter uint64
		want    []uint64
	}{
		{"empty", nil, 16, 0, nil},
		{"partial block only", seq(0, 15), 16, 0, nil},
		{"one block base", seq(0, 16), 16, 0, []uint64{0x3563e4acbc3b0421}},
		{"two blocks base", seq(0, 32), 16, 0, []uint64{0x3563e4acbc3b0421, 0x8dbaa712d5c0ca32}},
		{"one block adapter 7", seq(0, 16), 16, 7, []uint64{0x53ba9844d89ce0fd}},
		{"block size 4 tail dropped", []uint32{7, 42, 1000, 65535, 3, 0, 128}, 4, 0, []uint64{0xcceac1989f33525d}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := BlockHashes(c.tokens, c.bs, c.adapter)
			ref := refHash(c.tokens, c.bs, c.adapter)
			if len(got) != len(ref) {
				t.Fatalf("len %d, reference %d", len(got), len(ref))
			}
			for i := range got {
				if got[i] != ref[i] {
					t.Fatalf("block %d: %#x, reference %#x", i, got[i], ref[i])
				}
			}
			if len(got) != len(c.want) {
				t.Fatalf("len %d, want %d", len(got), len(c.want))
			}
			for i := range got {
				if got[i] != c.want[i] {
					t.Errorf("block %d: %#x, want %#x", i, got[i], c.want[i])
				}
			}
		})
	}
}

func TestBlockHashesAdapterIsolation(t *testing.T) {
	a := BlockHashes(seq(0, 32), 16, 0)
	b := BlockHashes(seq(0, 32), 16, 1)
	for i := range a {
		if a[i] == b[i] {
			t.Fatalf("block %d: adapters 0 and 1 share hash %#x", i, a[i])
		}
	}
}

func TestBlockHashesInvalidBlockSize(t *testing.T) {
	for _, bs := range []int{0, -1} {
		if got := BlockHashes(seq(0, 32), bs, 0); got != nil {
			t.Errorf("bs %d: got %v, want nil", bs, got)
		}
	}
}

func TestAppendBlockHashesDoesNotAllocate(t *testing.T) {
	tokens := seq(0, 8192)
	dst := make([]uint64, 0, 512)
	allocs := testing.AllocsPerRun(100, func() {
		dst = AppendBlockHashes(dst[:0], tokens, 16, 3)
	})
	if allocs != 0 {
		t.Fatalf("AppendBlockHashes allocated %.1f times per run", allocs)
	}
}

func TestChainHashLargeBlocksStream(t *testing.T) {
	// Blocks above maxStackChunk take the streaming path; both paths must agree with the reference.
	for _, bs := range []int{1, maxStackChunk - 1, maxStackChunk, maxStackChunk + 1, 300} {
		tokens := seq(5, uint32(5+3*bs))
		got := BlockHashes(tokens, bs, 9)
		ref := refHash(tokens, bs, 9)
		for i := range ref {
			if got[i] != ref[i] {
				t.Fatalf("bs %d block %d: %#x, reference %#x", bs, i, got[i], ref[i])
			}
		}
	}
}

// AdapterIDOf: the base model is 0, a decimal name is its number, any other name a hash with the
// top bit set (so it never equals a decimal id below 2⁶³), distinct names distinct ids.
func TestAdapterIDOf(t *testing.T) {
	if AdapterIDOf("") != 0 || AdapterIDOf("7") != 7 || AdapterIDOf("ad") == AdapterIDOf("ae") || AdapterIDOf("ad")>>63 != 1 {
		t.Fatal("AdapterIDOf")
	}
	if AdapterIDOf("18446744073709551616")>>63 != 1 { // 2⁶⁴ overflows: hashed, not wrapped
		t.Fatal("AdapterIDOf overflow")
	}
}
