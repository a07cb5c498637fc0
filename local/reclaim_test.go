package local

import "testing"

// treePool is a tiny KV block pool (a hand-written fake of the engine's) that applies the cache's
// results the way CONTRACT.md, "The caller's contract", says: refcounts per block, a block is free at 0.
type treePool struct {
	refs []int
}

func newTreePool(n int) *treePool { return &treePool{refs: make([]int, n)} }

func (p *treePool) free() int {
	n := 0
	for _, r := range p.refs {
		if r == 0 {
			n++
		}
	}
	return n
}

// alloc hands out k free blocks, each with the sequence's ref.
func (p *treePool) alloc(t *testing.T, k int) []uint32 {
	t.Helper()
	var out []uint32
	for b := range p.refs {
		if len(out) == k {
			break
		}
		if p.refs[b] == 0 {
			p.refs[b] = 1
			out = append(out, uint32(b))
		}
	}
	if len(out) != k {
		t.Fatalf("pool exhausted: wanted %d blocks", k)
	}
	return out
}

func (p *treePool) dec(t *testing.T, b uint32) {
	t.Helper()
	if p.refs[b] == 0 {
		t.Fatalf("block %d freed twice", b)
	}
	p.refs[b]--
}

// insert applies InsertAcquired: inc every acquired block before dec'ing every released one.
func (p *treePool) insert(t *testing.T, acq InsertAcquired) {
	for _, b := range acq.Blocks {
		p.refs[b]++
	}
	for _, b := range acq.ReleasedBlocks {
		p.dec(t, b)
	}
}

func (p *treePool) evicted(t *testing.T, ev EvictedBlocks) {
	for _, b := range ev.Physical {
		p.dec(t, b)
	}
}

// cacheSequence runs a finished sequence through the cache: allocate, insert, release, drop the
// sequence's own refs. Afterwards the cache holds the only ref on each block.
func (p *treePool) cacheSequence(t *testing.T, tr *RadixTree, tokens []uint32) {
	blocks := p.alloc(t, (len(tokens)+bs-1)/bs)
	p.insert(t, tr.Insert(tokens, blocks, nil, bs, 0, 0))
	tr.Release(tokens, bs, 0)
	for _, b := range blocks {
		p.dec(t, b)
	}
}

// treeReclaim is the engine's admission-time reclaim (CONTRACT.md, "PinPrefix"): pin the prompt's cached
// prefix, evict until `needed − pinned blocks` blocks are free or nothing is evictable, unpin.
func treeReclaim(t *testing.T, tr *RadixTree, p *treePool, prompt []uint32, needed int) (target, free int) {
	m := tr.PinPrefix(prompt, bs, 0)
	target = max(0, needed-m/bs)
	for p.free() < target {
		ev := tr.Evict(target - p.free())
		if ev.IsEmpty() {
			break
		}
		p.evicted(t, ev)
	}
	tr.ReleaseMatched(prompt, bs, m, 0)
	return target, p.free()
}

func TestReclaim(t *testing.T) { // the reference's prefix_reclaim_tests.rs, the tree half (tree_snapshot_test.go has the snapshots)
	prefix := toks(0, 96)
	t.Run("warm admission keeps the prefix it reuses", func(t *testing.T) {
		tr, p := NewRadixTree(Options{}), newTreePool(10)
		p.cacheSequence(t, tr, prefix)
		if p.free() != 4 {
			t.Fatalf("free %d", p.free())
		}
		target, free := treeReclaim(t, tr, p, cat(prefix, toks(1000, 1004)), 7)
		if target != 1 || free != 4 {
			t.Fatalf("reclaim = {target %d, free %d}, want {1, 4}", target, free)
		}
		for b, r := range p.refs {
			if r > 1 {
				t.Fatalf("block %d has KV ref %d", b, r)
			}
		}
		if n := tr.PeekMatchedTokens(prefix, bs, 0); n != 96 {
			t.Fatalf("peek %d", n)
		}
		lookupIs(t, tr, prefix, 0, 96, []uint32{0, 1, 2, 3, 4, 5})
	})
	t.Run("a tail that cannot fit evicts others but never the reused prefix", func(t *testing.T) {
		tr, p := NewRadixTree(Options{}), newTreePool(10)
		p.cacheSequence(t, tr, prefix)
		other := toks(5000, 5016)
		p.cacheSequence(t, tr, other)
		if p.free() != 3 {
			t.Fatalf("free %d", p.free())
		}
		target, free := treeReclaim(t, tr, p, cat(prefix, toks(1000, 1080)), 12)
		if target != 6 || free != 4 {
			t.Fatalf("reclaim = {target %d, free %d}, want {6, 4}", target, free)
		}
		if tr.PeekMatchedTokens(other, bs, 0) != 0 || tr.PeekMatchedTokens(prefix, bs, 0) != 96 {
			t.Fatal("wrong entry evicted")
		}
		ev := tr.Evict(6)
		eq(t, "whole chain in one call", ev.Physical, []uint32{5, 4, 3, 2, 1, 0})
		p.evicted(t, ev)
		if p.free() != 10 {
			t.Fatalf("free %d after evicting everything", p.free())
		}
	})
	t.Run("an empty prompt reserves everything", func(t *testing.T) {
		tr, p := NewRadixTree(Options{}), newTreePool(10)
		p.cacheSequence(t, tr, prefix)
		target, free := treeReclaim(t, tr, p, nil, 7)
		if target != 7 || free != 7 {
			t.Fatalf("reclaim = {target %d, free %d}, want {7, 7}", target, free)
		}
		if n := tr.PeekMatchedTokens(prefix, bs, 0); n != 48 {
			t.Fatalf("peek %d, want 48", n)
		}
	})
}
