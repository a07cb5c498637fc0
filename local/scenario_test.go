package local

import (
	"slices"
	"testing"
)

// Scenarios of the reference's tests (CONTRACT.md, "Reference tests"). Block size 16, matched 0 and adapter 0 unless stated.

const bs = 16

func eq[T comparable](t *testing.T, what string, got, want []T) {
	t.Helper()
	if len(got) == 0 && len(want) == 0 {
		return
	}
	if !slices.Equal(got, want) {
		t.Fatalf("%s = %v, want %v", what, got, want)
	}
}

func mustStructure(t *testing.T, tr *RadixTree) {
	t.Helper()
	if err := checkStructure(tr); err != nil {
		t.Fatal(err)
	}
}

func lookupIs(t *testing.T, tr *RadixTree, tokens []uint32, adapter uint64, wantTokens int, wantBlocks []uint32) {
	t.Helper()
	m := tr.Lookup(tokens, bs, 0, adapter)
	if m.MatchedTokens != wantTokens {
		t.Fatalf("lookup matched %d tokens, want %d", m.MatchedTokens, wantTokens)
	}
	eq(t, "lookup blocks", m.MatchedBlocks, wantBlocks)
	tr.ReleaseMatched(tokens, bs, m.MatchedTokens, adapter)
}

func stats(t *testing.T, tr *RadixTree, want int) {
	t.Helper()
	if e, c := tr.Stats(); e != want || c != want {
		t.Fatalf("stats = (%d,%d), want (%d,%d)", e, c, want, want)
	}
}

func TestBasic(t *testing.T) { // basic.rs
	t.Run("exact", func(t *testing.T) {
		tr := NewRadixTree(Options{})
		tr.Insert(toks(0, 16), []uint32{42}, nil, bs, 0, 0)
		lookupIs(t, tr, toks(0, 16), 0, 16, []uint32{42})
	})
	t.Run("multi-block", func(t *testing.T) {
		tr := NewRadixTree(Options{})
		tr.Insert(toks(0, 48), []uint32{10, 20, 30}, nil, bs, 0, 0)
		lookupIs(t, tr, toks(0, 48), 0, 48, []uint32{10, 20, 30})
	})
	t.Run("partial match and divergence", func(t *testing.T) {
		tr := NewRadixTree(Options{})
		tr.Insert(toks(0, 32), []uint32{10, 20}, nil, bs, 0, 0)
		lookupIs(t, tr, toks(0, 48), 0, 32, []uint32{10, 20})
		b := cat(toks(0, 32), toks(200, 216))
		tr.Insert(b, []uint32{10, 20, 30}, nil, bs, 0, 0)
		tr.Release(b, bs, 0)
		lookupIs(t, tr, b, 0, 48, []uint32{10, 20, 30})
		lookupIs(t, tr, cat(toks(0, 32), toks(700, 716)), 0, 32, []uint32{10, 20})
	})
	t.Run("no match", func(t *testing.T) {
		tr := NewRadixTree(Options{})
		tr.Insert(toks(0, 16), []uint32{10}, nil, bs, 0, 0)
		lookupIs(t, tr, toks(100, 116), 0, 0, nil)
		lookupIs(t, tr, toks(0, 16), 0, 16, []uint32{10})
	})
	t.Run("release decrements", func(t *testing.T) {
		tr := NewRadixTree(Options{})
		tr.Insert(toks(0, 16), []uint32{42}, nil, bs, 0, 0)
		tr.Release(toks(0, 16), bs, 0)
		m := tr.Lookup(toks(0, 16), bs, 0, 0)
		tr.Release(toks(0, 16), bs, 0)
		eq(t, "lookup", m.MatchedBlocks, []uint32{42})
		eq(t, "evict", tr.Evict(1).Physical, []uint32{42})
	})
	t.Run("insert then release keeps the entry", func(t *testing.T) {
		tr := NewRadixTree(Options{})
		tr.Insert(toks(0, 32), []uint32{10, 20}, nil, bs, 0, 0)
		tr.Release(toks(0, 32), bs, 0)
		lookupIs(t, tr, toks(0, 32), 0, 32, []uint32{10, 20})
	})
	t.Run("LRU not FIFO", func(t *testing.T) {
		tr := NewRadixTree(Options{})
		a, b := toks(0, 16), toks(100, 116)
		tr.Insert(a, []uint32{10}, nil, bs, 0, 0)
		tr.Release(a, bs, 0)
		tr.Insert(b, []uint32{20}, nil, bs, 0, 0)
		tr.Release(b, bs, 0)
		tr.Lookup(a, bs, 0, 0)
		tr.Release(a, bs, 0)
		eq(t, "evict 1", tr.Evict(1).Physical, []uint32{20})
		eq(t, "evict 2", tr.Evict(1).Physical, []uint32{10})
		stats(t, tr, 0)
	})
	t.Run("referenced nodes are skipped", func(t *testing.T) {
		tr := NewRadixTree(Options{})
		tr.Insert(toks(0, 16), []uint32{42}, nil, bs, 0, 0)
		tr.Release(toks(0, 16), bs, 0)
		tr.Lookup(toks(0, 16), bs, 0, 0)
		if ev := tr.Evict(1); !ev.IsEmpty() {
			t.Fatalf("evicted a held node: %v", ev.Physical)
		}
		tr.Release(toks(0, 16), bs, 0)
		eq(t, "evict", tr.Evict(1).Physical, []uint32{42})
	})
	t.Run("chain eviction leaf first", func(t *testing.T) {
		tr := NewRadixTree(Options{})
		tr.Insert(toks(0, 48), []uint32{10, 20, 30}, nil, bs, 0, 0)
		tr.Release(toks(0, 48), bs, 0)
		for _, want := range []uint32{30, 20, 10} {
			eq(t, "evict", tr.Evict(1).Physical, []uint32{want})
		}
		stats(t, tr, 0)
	})
	t.Run("idempotent insert and adoption", func(t *testing.T) {
		tr := NewRadixTree(Options{})
		tr.Insert(toks(0, 16), []uint32{42}, nil, bs, 0, 0)
		tr.Insert(toks(0, 16), []uint32{42}, nil, bs, 0, 0)
		stats(t, tr, 1)
		acq := tr.Insert(toks(0, 16), []uint32{43}, nil, bs, 16, 0)
		eq(t, "blocks (matched)", acq.Blocks, nil)
		eq(t, "released (matched)", acq.ReleasedBlocks, nil)
		lookupIs(t, tr, toks(0, 16), 0, 16, []uint32{42})
		acq = tr.Insert(toks(0, 16), []uint32{43}, nil, bs, 0, 0)
		eq(t, "blocks", acq.Blocks, []uint32{43})
		eq(t, "released", acq.ReleasedBlocks, []uint32{42})
		lookupIs(t, tr, toks(0, 16), 0, 16, []uint32{43})
		stats(t, tr, 1)
	})
	t.Run("recomputed prefix frees the old blocks", func(t *testing.T) {
		tr := NewRadixTree(Options{})
		r1 := toks(0, 64)
		eq(t, "r1 blocks", tr.Insert(r1, []uint32{10, 11, 12, 13}, nil, bs, 0, 0).Blocks, []uint32{10, 11, 12, 13})
		tr.Release(r1, bs, 0)
		r2 := cat(toks(0, 48), toks(500, 532))
		acq := tr.Insert(r2, []uint32{20, 21, 22, 23, 24}, nil, bs, 0, 0)
		eq(t, "released", acq.ReleasedBlocks, []uint32{10, 11, 12})
		eq(t, "blocks", acq.Blocks, []uint32{20, 21, 22, 23, 24})
		eq(t, "evict", tr.Evict(16).Physical, []uint32{13})
		lookupIs(t, tr, r2, 0, 80, []uint32{20, 21, 22, 23, 24})
	})
	t.Run("branching", func(t *testing.T) {
		tr := NewRadixTree(Options{})
		a, b := toks(0, 32), cat(toks(0, 16), toks(100, 116))
		tr.Insert(a, []uint32{10, 20}, nil, bs, 0, 0)
		tr.Insert(b, []uint32{10, 30}, nil, bs, 0, 0)
		lookupIs(t, tr, a, 0, 32, []uint32{10, 20})
		lookupIs(t, tr, b, 0, 32, []uint32{10, 30})
		stats(t, tr, 3)
	})
	t.Run("fewer tokens than one block", func(t *testing.T) {
		tr := NewRadixTree(Options{})
		acq := tr.Insert(toks(0, 10), []uint32{42}, nil, bs, 0, 0)
		if len(acq.Blocks)+len(acq.ReleasedBlocks)+len(acq.DiskBlockIDs) != 0 {
			t.Fatalf("acquired %+v", acq)
		}
		stats(t, tr, 0)
		lookupIs(t, tr, toks(0, 10), 0, 0, nil)
	})
	t.Run("partial-suffix ownership", func(t *testing.T) {
		tr := NewRadixTree(Options{})
		acq := tr.Insert(toks(0, 20), []uint32{10, 11}, nil, bs, 0, 0)
		eq(t, "blocks", acq.Blocks, []uint32{10, 11})
		eq(t, "released", acq.ReleasedBlocks, nil)
		eq(t, "repeat blocks", tr.Insert(toks(0, 20), []uint32{10, 11}, nil, bs, 0, 0).Blocks, nil)
		acq = tr.Insert(cat(toks(0, 16), toks(90, 94)), []uint32{10, 12}, nil, bs, 0, 0)
		eq(t, "blocks", acq.Blocks, []uint32{12})
		eq(t, "released", acq.ReleasedBlocks, []uint32{11})
	})
}

func TestHSS(t *testing.T) { // basic_hss.rs
	tr := NewRadixTree(Options{})
	acq := tr.Insert(toks(0, 32), []uint32{10, 20}, []uint32{100, 101}, bs, 0, 0)
	eq(t, "disk", acq.DiskBlockIDs, []uint32{100, 101})
	eq(t, "blocks", acq.Blocks, []uint32{10, 20})
	acq = tr.Insert(toks(0, 32), []uint32{10, 20}, []uint32{100, 101}, bs, 0, 0)
	eq(t, "re-insert disk", acq.DiskBlockIDs, nil)
	eq(t, "re-insert blocks", acq.Blocks, nil)
	m := tr.Lookup(toks(0, 32), bs, 0, 0)
	eq(t, "lookup disk", m.MatchedDiskBlockIDs, []uint32{100, 101})

	tr = NewRadixTree(Options{})
	tr.Insert(toks(0, 32), []uint32{10, 20}, []uint32{100, 101}, bs, 0, 0)
	acq = tr.Insert(toks(0, 48), []uint32{10, 20, 30}, []uint32{100, 101, 102}, bs, 0, 0)
	eq(t, "extension disk", acq.DiskBlockIDs, []uint32{102})
	eq(t, "extension blocks", acq.Blocks, []uint32{30})

	tr = NewRadixTree(Options{})
	acq = tr.Insert(toks(0, 32), []uint32{10, 20}, nil, bs, 0, 0)
	eq(t, "off disk", acq.DiskBlockIDs, nil)
	eq(t, "off blocks", acq.Blocks, []uint32{10, 20})
	if m := tr.Lookup(toks(0, 32), bs, 0, 0); len(m.MatchedDiskBlockIDs) != 0 {
		t.Fatalf("disk list %v, want empty", m.MatchedDiskBlockIDs)
	}
}

func TestAdapters(t *testing.T) { // adapter.rs
	const a, b = 0xA, 0xB
	tr := NewRadixTree(Options{})
	tr.Insert(toks(0, 32), []uint32{10, 20}, nil, bs, 0, a)
	tr.Release(toks(0, 32), bs, a)
	lookupIs(t, tr, toks(0, 32), b, 0, nil)
	lookupIs(t, tr, toks(0, 32), 0, 0, nil)
	lookupIs(t, tr, toks(0, 32), a, 32, []uint32{10, 20})

	tr = NewRadixTree(Options{})
	tr.Insert(toks(0, 32), []uint32{10, 20}, nil, bs, 0, 0)
	lookupIs(t, tr, toks(0, 32), 0xABCD, 0, nil)
	lookupIs(t, tr, toks(0, 32), 0, 32, []uint32{10, 20})

	tr = NewRadixTree(Options{})
	tr.Insert(toks(0, 32), []uint32{10, 20}, nil, bs, 0, a)
	tr.Insert(toks(0, 32), []uint32{30, 40}, nil, bs, 0, b)
	lookupIs(t, tr, toks(0, 32), a, 32, []uint32{10, 20})
	lookupIs(t, tr, toks(0, 32), b, 32, []uint32{30, 40})
	mustStructure(t, tr)
}

func TestPartialTail(t *testing.T) { // partial_tail.rs
	for _, armed := range []bool{false, true} {
		tr := NewRadixTree(Options{SubBlockMatching: armed})
		tr.Insert(toks(0, 20), []uint32{10, 11}, nil, bs, 0, 0)
		m := tr.Lookup(toks(0, 20), bs, 0, 0)
		if armed {
			if m.MatchedTokens != 20 || !slices.Equal(m.MatchedBlocks, []uint32{10, 11}) {
				t.Fatalf("armed: %d %v", m.MatchedTokens, m.MatchedBlocks)
			}
		} else if m.MatchedTokens != 16 || !slices.Equal(m.MatchedBlocks, []uint32{10}) {
			t.Fatalf("off: %d %v", m.MatchedTokens, m.MatchedBlocks)
		}
		tr = NewRadixTree(Options{SubBlockMatching: armed})
		tr.Insert(toks(0, 35), []uint32{10, 20, 30}, nil, bs, 0, 0)
		m = tr.Lookup(toks(0, 22), bs, 0, 0)
		if armed {
			if m.MatchedTokens != 22 || !slices.Equal(m.MatchedBlocks, []uint32{10, 20}) {
				t.Fatalf("armed child-key: %d %v", m.MatchedTokens, m.MatchedBlocks)
			}
			if p := tr.PeekMatchedTokens(toks(0, 22), bs, 0); p != 22 {
				t.Fatalf("armed peek %d", p)
			}
		} else if m.MatchedTokens != 16 || !slices.Equal(m.MatchedBlocks, []uint32{10}) {
			t.Fatalf("off: %d %v", m.MatchedTokens, m.MatchedBlocks)
		}
		lookupIs(t, tr, toks(0, 32), 0, 32, []uint32{10, 20})
	}
}

func TestSubBlockDeterministicChild(t *testing.T) {
	// Two children start with the same suffix: the oldest wins, every time.
	tr := NewRadixTree(Options{SubBlockMatching: true})
	tr.Insert(cat(toks(0, 16), toks(100, 116)), []uint32{1, 2}, nil, bs, 0, 0)
	tr.Insert(cat(toks(0, 16), toks(100, 104), toks(500, 512)), []uint32{1, 3}, nil, bs, 0, 0)
	tr.Insert(cat(toks(0, 16), toks(100, 103), toks(600, 613)), []uint32{1, 4}, nil, bs, 0, 0)
	lookupIs(t, tr, cat(toks(0, 16), toks(100, 103)), 0, 19, []uint32{1, 2})
	// From the root, a prompt shorter than one block.
	lookupIs(t, tr, toks(0, 5), 0, 5, []uint32{1})
}

func TestNoPrefixCaching(t *testing.T) { // the telemetry crate's prefix_cache tests
	if !(PrefixMatch{}).IsEmpty() {
		t.Fatal("empty match not empty")
	}
	c := NoPrefixCaching
	if c.IsActive() {
		t.Fatal("active")
	}
	if m := c.Lookup(toks(0, 32), bs, 1, 0); !m.IsEmpty() || m.MatchedBlocks != nil {
		t.Fatalf("lookup %+v", m)
	}
	if acq := c.Insert(toks(0, 32), []uint32{1, 2}, nil, bs, 0, 0); acq.Blocks != nil || acq.DiskBlockIDs != nil {
		t.Fatalf("insert %+v", acq)
	}
	c.Release(toks(0, 32), bs, 0)
	c.ReleaseMatched(toks(0, 32), bs, 32, 0)
	if !c.Evict(10).IsEmpty() {
		t.Fatal("evict")
	}
	if _, ok := c.EvictSnapshotLRU(); ok {
		t.Fatal("snapshot lru")
	}
	if _, ok, _ := c.InsertWithSnapshot(toks(0, 32), []uint32{1, 2}, nil, bs, 5, 1, 0, 0); ok {
		t.Fatal("insert with snapshot")
	}
	if c.SnapshotCount() != 0 || c.PeekMatchedTokens(toks(0, 16), bs, 0) != 0 || c.PinPrefix(toks(0, 16), bs, 0) != 0 {
		t.Fatal("counts")
	}
	if _, ok := c.EvictSnapshotToTier(0); ok || c.PromoteSnapshot(1, 2) || c.ForgetSnapshotTierKey(1) || c.EvictSnapshotSlot(1) {
		t.Fatal("tier defaults")
	}
	if e, b := c.Stats(); e != 0 || b != 0 {
		t.Fatal("stats")
	}
	if _, ok := c.InsertIntermediateSnapshot(toks(0, 32), nil, nil, bs, 1, 1, 0, 0); ok {
		t.Fatal("intermediate snapshot")
	}
	if c.InsertTailSnapshot(toks(0, 32), 1, 1, 0) != nil {
		t.Fatal("tail snapshot")
	}
	if _, ok := c.InsertTailSiblingSnapshot(toks(0, 32), 1, 1, 0); ok {
		t.Fatal("sibling snapshot")
	}
	if !NewRadixTree(Options{}).IsActive() {
		t.Fatal("a RadixTree is active")
	}
}

func TestExtra(t *testing.T) { // not in the reference: CONTRACT.md, "Decisions", and edge cases
	t.Run("over-release", func(t *testing.T) {
		tr := NewRadixTree(Options{})
		tr.Insert(toks(0, 16), []uint32{42}, nil, bs, 0, 0)
		tr.Release(toks(0, 16), bs, 0)
		tr.Release(toks(0, 16), bs, 0)
		tr.Release(toks(0, 16), bs, 0) // saturates at 0
		if p := tr.PeekMatchedTokens(toks(0, 16), bs, 0); p != 0 {
			t.Fatalf("peek %d over a zero-ref node", p)
		}
		mustStructure(t, tr)
		eq(t, "evict", tr.Evict(1).Physical, []uint32{42})

		tr.Insert(toks(0, 16), []uint32{42}, nil, bs, 0, 0)
		tr.Release(toks(0, 16), bs, 0)
		tr.Release(toks(0, 16), bs, 0)
		tr.Insert(toks(0, 16), []uint32{42}, nil, bs, 0, 0) // restores 1, then +1
		tr.Release(toks(0, 16), bs, 0)
		lookupIs(t, tr, toks(0, 16), 0, 16, []uint32{42})
		mustStructure(t, tr)
	})
	t.Run("release of unknown adapter or tokens", func(t *testing.T) {
		tr := NewRadixTree(Options{})
		tr.Insert(toks(0, 16), []uint32{42}, nil, bs, 0, 0)
		tr.Release(toks(0, 16), bs, 0)
		tr.Release(toks(0, 16), bs, 77)
		tr.Release(toks(500, 532), bs, 0)
		lookupIs(t, tr, toks(0, 16), 0, 16, []uint32{42})
	})
	t.Run("empty insert creates a root only", func(t *testing.T) {
		tr := NewRadixTree(Options{})
		tr.Insert(nil, nil, nil, bs, 0, 9)
		stats(t, tr, 0)
		if len(tr.roots) != 2 {
			t.Fatalf("roots %d", len(tr.roots))
		}
		lookupIs(t, tr, toks(0, 16), 9, 0, nil)
	})
	t.Run("short block table", func(t *testing.T) {
		tr := NewRadixTree(Options{})
		acq := tr.Insert(toks(0, 52), []uint32{1, 2}, nil, bs, 0, 0)
		eq(t, "blocks", acq.Blocks, []uint32{1, 2})
		stats(t, tr, 2)
		tr.Release(toks(0, 52), bs, 0)
		eq(t, "evict", tr.Evict(10).Physical, []uint32{2, 1})
	})
	t.Run("partial on an internal node", func(t *testing.T) {
		tr := NewRadixTree(Options{})
		tr.Insert(toks(0, 32), []uint32{10, 20}, nil, bs, 0, 0)
		tr.Release(toks(0, 32), bs, 0)
		tr.Insert(toks(0, 20), []uint32{10, 11}, nil, bs, 0, 0)
		tr.Release(toks(0, 20), bs, 0)
		eq(t, "evict 1", tr.Evict(1).Physical, []uint32{20})
		eq(t, "evict 2", tr.Evict(1).Physical, []uint32{10, 11})
	})
	t.Run("partial disk id released when replaced or superseded", func(t *testing.T) {
		tr := NewRadixTree(Options{})
		acq := tr.Insert(toks(0, 20), []uint32{10, 11}, []uint32{100, 101}, bs, 0, 0)
		eq(t, "disk", acq.DiskBlockIDs, []uint32{100, 101})
		acq = tr.Insert(cat(toks(0, 16), toks(90, 93)), []uint32{10, 12}, []uint32{100, 102}, bs, 0, 0)
		eq(t, "replace disk", acq.DiskBlockIDs, []uint32{102})
		eq(t, "replace released disk", acq.ReleasedDiskBlockIDs, []uint32{101})
		eq(t, "replace released", acq.ReleasedBlocks, []uint32{11})
		acq = tr.Insert(toks(0, 32), []uint32{10, 13}, []uint32{100, 103}, bs, 0, 0)
		eq(t, "supersede released", acq.ReleasedBlocks, []uint32{12})
		eq(t, "supersede released disk", acq.ReleasedDiskBlockIDs, []uint32{102})
		eq(t, "supersede disk", acq.DiskBlockIDs, []uint32{103})
	})
	t.Run("invalid arguments change nothing", func(t *testing.T) {
		tr := NewRadixTree(Options{})
		tr.Insert(toks(0, 32), []uint32{10, 20}, nil, bs, 0, 0)
		before := sortedHashes(tr)
		head := tr.SummaryHead()
		bad := []struct {
			name           string
			tok, bt, disks []uint32
			bs             int
		}{
			{"zero block size", toks(0, 32), []uint32{1, 2}, nil, 0},
			{"negative block size", toks(0, 32), []uint32{1, 2}, nil, -3},
			{"short disk list", toks(0, 32), []uint32{1, 2}, []uint32{5}, bs},
			{"long disk list", toks(0, 32), []uint32{1, 2}, []uint32{5, 6, 7}, bs},
			{"NoBlock full chunk", toks(0, 48), []uint32{1, NoBlock, 3}, nil, bs},
			{"NoBlock partial", toks(0, 20), []uint32{1, NoBlock}, nil, bs},
		}
		for _, c := range bad {
			acq := tr.Insert(c.tok, c.bt, c.disks, c.bs, 0, 5)
			if acq.Blocks != nil || acq.ReleasedBlocks != nil || acq.DiskBlockIDs != nil {
				t.Fatalf("%s: acquired %+v", c.name, acq)
			}
			if m := tr.Lookup(c.tok, c.bs, 0, 0); c.bs <= 0 && !m.IsEmpty() {
				t.Fatalf("%s: lookup matched", c.name)
			}
			tr.Release(c.tok, c.bs, 0)
			tr.ReleaseMatched(c.tok, c.bs, 32, 0)
			if tr.PinPrefix(c.tok, c.bs, 0) != 0 && c.bs <= 0 {
				t.Fatalf("%s: pinned", c.name)
			}
		}
		if len(tr.roots) != 1 {
			t.Fatal("an invalid insert created a root")
		}
		if hs := tr.HitStats(); hs.Hits+hs.Misses != 4 { // only the four valid-bs lookups count
			t.Fatalf("hit stats %+v", hs)
		}
		if !slices.Equal(sortedHashes(tr), before) || tr.SummaryHead() != head {
			t.Fatal("summary changed")
		}
		// NoBlock past the chunks the insert reads is fine.
		acq := tr.Insert(toks(0, 32), []uint32{10, 20, NoBlock}, nil, bs, 0, 0)
		eq(t, "tail NoBlock ignored", acq.Blocks, nil)
		if tr.Evict(-1).Len() != 0 || tr.Evict(0).Len() != 0 {
			t.Fatal("evict <= 0")
		}
		mustStructure(t, tr)
	})
	t.Run("hash collision never returns another prefix's blocks", func(t *testing.T) {
		tr := NewRadixTree(Options{})
		a := toks(0, 32)
		tr.Insert(a, []uint32{10, 20}, nil, bs, 0, 0)
		tr.Release(a, bs, 0)
		// Forge a collision: a's first node now carries the hash of b's first block.
		b := toks(1000, 1032)
		ha, hb := ChainHash(0, a[:16]), ChainHash(0, b[:16])
		forge := func(from, to uint64) {
			tr.mu.Lock()
			c := tr.children.get(tr.nodes, from)
			tr.children.del(tr.nodes, from)
			tr.nodes[c].hash = to
			tr.children.put(tr.nodes, c)
			tr.mu.Unlock()
		}
		forge(ha, hb)
		if p := tr.PeekMatchedTokens(b, bs, 0); p != 0 {
			t.Fatalf("peek through a collision: %d", p)
		}
		lookupIs(t, tr, b, 0, 0, nil)
		acq := tr.Insert(b, []uint32{30, 40}, nil, bs, 0, 0)
		if len(acq.Blocks) != 0 {
			t.Fatalf("inserted through a collision: %+v", acq)
		}
		tr.Release(b, bs, 0) // must not touch a's nodes
		forge(hb, ha)
		lookupIs(t, tr, a, 0, 32, []uint32{10, 20})
		stats(t, tr, 2)
		mustStructure(t, tr)
	})
	t.Run("token slab limit", func(t *testing.T) {
		tr := NewRadixTree(Options{})
		tr.slab.limit = 40 // two 16-token blocks fit, a third does not
		acq := tr.Insert(toks(0, 52), []uint32{1, 2, 3, 4}, nil, bs, 0, 0)
		eq(t, "blocks", acq.Blocks, []uint32{1, 2})
		stats(t, tr, 2)
		mustStructure(t, tr)
		tr.Release(toks(0, 52), bs, 0)
		eq(t, "evict", tr.Evict(1).Physical, []uint32{2})
		// The freed run is reused: another 16-token block fits again.
		eq(t, "reuse", tr.Insert(cat(toks(0, 16), toks(90, 106)), []uint32{1, 5}, nil, bs, 0, 0).Blocks, []uint32{5})
		mustStructure(t, tr)
	})
	t.Run("mixed block sizes", func(t *testing.T) {
		tr := NewRadixTree(Options{})
		tr.Insert(toks(0, 32), []uint32{1, 2}, nil, 16, 0, 0)
		tr.Insert(toks(0, 32), []uint32{3}, nil, 32, 0, 0)
		tr.Insert(toks(0, 48), []uint32{1, 4, 5, 6, 7, 8}, nil, 8, 0, 0)
		if p := tr.PeekMatchedTokens(toks(0, 32), 16, 0); p != 32 {
			t.Fatalf("bs16 peek %d", p)
		}
		if p := tr.PeekMatchedTokens(toks(0, 64), 32, 0); p != 32 {
			t.Fatalf("bs32 peek %d", p)
		}
		if p := tr.PeekMatchedTokens(toks(0, 48), 8, 0); p != 48 {
			t.Fatalf("bs8 peek %d", p)
		}
		stats(t, tr, 9)
		mustStructure(t, tr)
		if n := len(sortedHashes(tr)); n != 9 {
			t.Fatalf("summary %d", n)
		}
	})
}

func TestHitStatsPerInstance(t *testing.T) {
	a, b := NewRadixTree(Options{}), NewRadixTree(Options{})
	a.Insert(toks(0, 32), []uint32{1, 2}, nil, bs, 0, 0)
	a.Lookup(toks(0, 40), bs, 0, 0)
	a.Lookup(toks(100, 140), bs, 0, 0)
	a.PeekMatchedTokens(toks(0, 40), bs, 0)
	a.PinPrefix(toks(0, 40), bs, 0)
	if got := a.HitStats(); got != (HitStats{Hits: 1, Misses: 1, HitTokens: 32}) {
		t.Fatalf("a: %+v", got)
	}
	if got := b.HitStats(); got != (HitStats{}) {
		t.Fatalf("b: %+v", got)
	}
}

func TestLookupInto(t *testing.T) {
	tr := NewRadixTree(Options{})
	tr.Insert(toks(0, 32), []uint32{1, 2}, []uint32{7, NoBlock}, bs, 0, 0)
	var m PrefixMatch
	tr.LookupInto(&m, toks(0, 32), bs, 0, 0)
	eq(t, "blocks", m.MatchedBlocks, []uint32{1, 2})
	eq(t, "disks", m.MatchedDiskBlockIDs, []uint32{7, NoBlock})
	tr.LookupInto(&m, toks(900, 932), bs, 0, 0)
	if !m.IsEmpty() || len(m.MatchedBlocks) != 0 || len(m.MatchedDiskBlockIDs) != 0 {
		t.Fatalf("reused match not reset: %+v", m)
	}
}
