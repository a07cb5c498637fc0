package pins

import (
	"testing"

	"github.com/prefixmesh/prefixmesh/local"
)

// The node agent hands its *local.RadixTree to NewApplier.
var _ PrefixCache = (*local.RadixTree)(nil)

// PrefixHash keys prefix pins in Raft logs and snapshots, so its values are fixed: a change
// would orphan every stored prefix pin.
func TestPrefixHashFixedVectors(t *testing.T) {
	toks := []uint32{1, 2, 3, 4, 5}
	for _, c := range []struct {
		adapter uint64
		tokens  []uint32
		want    uint64
	}{
		{0, toks, 0x45241d06973c76ef},
		{7, toks, 0xc8bf1a789c52ddca},
		{7, nil, 0xd1bcc501c5b2d4b9},
	} {
		if got := PrefixHash(c.adapter, c.tokens); got != c.want {
			t.Errorf("PrefixHash(%d, %v) = %#x, want %#x", c.adapter, c.tokens, got, c.want)
		}
	}
}
