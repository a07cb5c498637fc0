package pins

import (
	"testing"

	"github.com/prefixmesh/prefixmesh/local"
)

// The node agent hands its *local.RadixTree to NewApplier.
var _ PrefixCache = (*local.RadixTree)(nil)

// PrefixHash is the canonical block hash of DESIGN.md §4 with the whole prefix as one block.
func TestPrefixHashEqualsLocalChainHash(t *testing.T) {
	toks := make([]uint32, 300)
	for i := range toks {
		toks[i] = uint32(i*2654435761) >> 7
	}
	for _, adapter := range []uint64{0, 1, 77, 1 << 60} {
		for _, n := range []int{1, 2, 63, 64, 65, 300} {
			if got, want := PrefixHash(adapter, toks[:n]), local.ChainHash(local.AdapterSeed(adapter), toks[:n]); got != want {
				t.Fatalf("adapter %d, %d tokens: %x, want %x", adapter, n, got, want)
			}
		}
	}
}
