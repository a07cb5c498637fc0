package local

import "testing"

func snapSeq(from, to uint32) []uint32 {
	out := make([]uint32, 0, to-from)
	for t := from; t < to; t++ {
		out = append(out, t)
	}
	return out
}

// TestPrefixHashVectors pins vectors computed independently of this code. The
// tier store keys blobs by these values, so a change here orphans every spilled snapshot.
func TestPrefixHashVectors(t *testing.T) {
	mixed := []uint32{7, 42, 1000, 65535, 3, 0, 128}
	cases := []struct {
		name    string
		tokens  []uint32
		adapter uint64
		want    uint64
	}{
		{"empty/0", nil, 0, 0xcbf29ce484222325},
		{"empty/AA", nil, 0xAA, 0xaf64274c86026bfd},
		{"123/0", []uint32{1, 2, 3}, 0, 0xd0aa6218672cf5ab},
		{"123/5", []uint32{1, 2, 3}, 5, 0x35e2c655f3a39860},
		{"mixed/0", mixed, 0, 0x4b9e1c56633bc956},
		{"mixed/99", mixed, 99, 0xe4da0a554570243f},
		{"0..16/0", snapSeq(0, 16), 0, 0x7c84dc9477851775},
	}
	for _, c := range cases {
		if got := prefixHash(c.tokens, len(c.tokens), c.adapter); got != c.want {
			t.Errorf("%s: prefixHash = %#x, want %#x", c.name, got, c.want)
		}
	}
}

// TestContextHashVectors checks the same FNV word step against the reference's tree-context hash vectors
// (root hash 0, no adapter fold). The tree itself uses the canonical block hash instead; the
// vectors are kept to show the step function is the reference's.
func TestContextHashVectors(t *testing.T) {
	first := prefixHashExtend(0, snapSeq(0, 16))
	if first != 0xb9047072062519c0 {
		t.Fatalf("context hash of chunk 0..16 = %#x", first)
	}
	if second := prefixHashExtend(first, snapSeq(16, 32)); second != 0xbe7b994c7eadd900 {
		t.Fatalf("context hash of chunk 16..32 = %#x", second)
	}
}

// TestPrefixHashProperties covers the reference's snapshot.rs case 13 and the clamping of count.
func TestPrefixHashProperties(t *testing.T) {
	toks := []uint32{9, 8, 7, 6, 5}
	// Adapter 0 is plain FNV over the tokens.
	plain := prefixHashOffset
	for _, tok := range toks {
		plain ^= uint64(tok)
		plain *= prefixHashPrime
	}
	if got := prefixHash(toks, len(toks), 0); got != plain {
		t.Fatalf("adapter 0: %#x, want plain FNV %#x", got, plain)
	}
	if prefixHash(toks, 5, 99) == plain {
		t.Fatal("adapter 99 must differ from adapter 0")
	}
	if prefixHash(toks, 5, 7) == prefixHash(toks, 5, 9) {
		t.Fatal("adapters 7 and 9 must differ")
	}
	if prefixHash(toks, 99, 0) != plain || prefixHash(toks, -1, 0) != prefixHashOffset {
		t.Fatal("count must clamp to [0, len(tokens)]")
	}
	// Running extension equals hashing from scratch at every depth.
	h := prefixHashSeed(3)
	for d := 0; d <= len(toks); d++ {
		if d > 0 {
			h = prefixHashExtend(h, toks[d-1:d])
		}
		if h != prefixHash(toks, d, 3) {
			t.Fatalf("running hash differs at depth %d", d)
		}
	}
}
