package pins

import (
	"fmt"
	"testing"
)

// fakeCache models the part of local.RadixTree the Applier uses: a cached length per
// (adapter, tokens) prefix and a hold count per cached block.
type fakeCache struct {
	bs     int
	cached map[string]int // adapter/tokens → cached full-block tokens
	holds  map[string]int // adapter/block-prefix → holds
}

func newFakeCache(bs int) *fakeCache {
	return &fakeCache{bs: bs, cached: map[string]int{}, holds: map[string]int{}}
}

func fkey(tokens []uint32, adapter uint64) string { return fmt.Sprint(adapter, tokens) }

func (f *fakeCache) PeekMatchedTokens(tokens []uint32, bs int, adapter uint64) int {
	return min(f.cached[fkey(tokens, adapter)], len(tokens)/bs*bs)
}

func (f *fakeCache) PinPrefix(tokens []uint32, bs int, adapter uint64) int {
	m := f.PeekMatchedTokens(tokens, bs, adapter)
	for b := bs; b <= m; b += bs {
		f.holds[fkey(tokens[:b], adapter)]++
	}
	return m
}

func (f *fakeCache) ReleaseMatched(tokens []uint32, bs, matched int, adapter uint64) {
	for b := bs; b <= matched; b += bs {
		k := fkey(tokens[:b], adapter)
		f.holds[k]--
		if f.holds[k] < 0 {
			panic("released a block more often than it was held")
		}
		if f.holds[k] == 0 {
			delete(f.holds, k)
		}
	}
}

func TestApplier(t *testing.T) {
	cache := newFakeCache(2)
	a := NewApplier(cache, 2)
	toks := []uint32{1, 2, 3, 4, 5}
	pin := PrefixPin{AdapterID: 1, Hash: PrefixHash(1, toks), Tokens: toks, Nodes: []string{"n"}}

	if st := a.Apply([]PrefixPin{pin}); st.Pending != 1 || st.Held != 0 {
		t.Fatalf("nothing cached: %+v", st)
	}
	cache.cached[fkey(toks, 1)] = 2 // a request brought the first block
	if st := a.Apply([]PrefixPin{pin}); st.Pinned != 1 || st.Held != 1 {
		t.Fatalf("first block cached: %+v", st)
	}
	if len(cache.holds) != 1 {
		t.Fatalf("holds %v", cache.holds)
	}
	if st := a.Apply([]PrefixPin{pin}); st.Pinned != 0 || st.Released != 0 {
		t.Fatalf("idempotent Apply did work: %+v", st)
	}
	cache.cached[fkey(toks, 1)] = 4 // the rest became cached: upgrade the hold
	if st := a.Apply([]PrefixPin{pin}); st.Pinned != 1 || st.Released != 1 {
		t.Fatalf("upgrade: %+v", st)
	}
	if got := a.Held()[pin.Key()]; got != 4 {
		t.Fatalf("held %d tokens, want 4", got)
	}
	if cache.holds[fkey(toks[:2], 1)] != 1 || cache.holds[fkey(toks[:4], 1)] != 1 {
		t.Fatalf("after upgrade every block holds once: %v", cache.holds)
	}
	if n := a.ReleaseAll(); n != 1 || len(cache.holds) != 0 {
		t.Fatalf("unpin released %d, holds left %v", n, cache.holds)
	}
}
