package local

import (
	"slices"
	"sync"
	"testing"
)

// Snapshot scenarios through the RadixTree: the reference's basic.rs cases 14–18, snapshot.rs,
// snapshot_reap.rs cases 1–2, the snapshot parts of prefix_reclaim_tests.rs, and decisions. Block size 16, matched 0, adapter 0 unless stated.

const snapBS = 16

func snapCat(parts ...[]uint32) []uint32 {
	var out []uint32
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// snapLookup looks tokens up and rolls the lookup's holds back, leaving the tree as it was.
func snapLookup(tr *RadixTree, tokens []uint32, session, adapter uint64) PrefixMatch {
	m := tr.Lookup(tokens, snapBS, session, adapter)
	tr.ReleaseMatched(tokens, snapBS, m.MatchedTokens, adapter)
	return m
}

func wantAnchor(t *testing.T, m PrefixMatch, matched, slot, depth int) {
	t.Helper()
	if m.MatchedTokens != matched || !m.HasSSMSnapshot || m.SSMSnapshot != slot || m.SSMSnapshotTokens != depth ||
		m.HasSSMSnapshotTier || m.SSMSnapshotTierToks != 0 {
		t.Fatalf("lookup = %+v, want matched %d, resident anchor %d at %d", m, matched, slot, depth)
	}
}

func wantNoAnchor(t *testing.T, m PrefixMatch, matched int) {
	t.Helper()
	if m.MatchedTokens != matched || m.HasSSMSnapshot || m.SSMSnapshotTokens != 0 || m.HasSSMSnapshotTier ||
		m.SSMSnapshotTierKey != 0 || m.SSMSnapshotTierToks != 0 || m.SSMSnapshotIsTail {
		t.Fatalf("lookup = %+v, want matched %d and no anchor", m, matched)
	}
}

func TestTreeSnapshotBasic(t *testing.T) { // basic.rs cases 14–18
	t.Run("insert and lookup", func(t *testing.T) {
		tr := NewRadixTree(Options{})
		d, ok, acq := tr.InsertWithSnapshot(snapSeq(0, 32), []uint32{10, 20}, nil, snapBS, 42, 0, 0, 0)
		if ok || !slices.Equal(acq.Blocks, []uint32{10, 20}) {
			t.Fatalf("InsertWithSnapshot = (%d,%v,%+v)", d, ok, acq)
		}
		wantAnchor(t, snapLookup(tr, snapSeq(0, 32), 0, 0), 32, 42, 32)
	})
	t.Run("snapshot deeper than the match", func(t *testing.T) {
		tr := NewRadixTree(Options{})
		tr.InsertWithSnapshot(snapSeq(0, 48), []uint32{10, 20, 30}, nil, snapBS, 42, 0, 0, 0)
		wantNoAnchor(t, snapLookup(tr, snapSeq(0, 32), 0, 0), 32)
	})
	t.Run("snapshot survives tree eviction", func(t *testing.T) {
		tr := NewRadixTree(Options{})
		tr.InsertWithSnapshot(snapSeq(0, 16), []uint32{10}, nil, snapBS, 7, 0, 0, 0)
		tr.Release(snapSeq(0, 16), snapBS, 0)
		if ev := tr.Evict(1); !slices.Equal(ev.Physical, []uint32{10}) {
			t.Fatalf("evict = %v", ev.Physical)
		}
		if tr.SnapshotCount() != 1 {
			t.Fatalf("count %d", tr.SnapshotCount())
		}
		s, ok := tr.EvictSnapshotLRU()
		wantSlot(t, "EvictSnapshotLRU", s, ok, 7)
		s, ok = tr.EvictSnapshotLRU()
		wantNone(t, "EvictSnapshotLRU", s, ok)
		if tr.SnapshotCount() != 0 {
			t.Fatalf("count %d", tr.SnapshotCount())
		}
	})
	t.Run("overwrite", func(t *testing.T) {
		tr := NewRadixTree(Options{})
		tr.InsertWithSnapshot(snapSeq(0, 16), []uint32{10}, nil, snapBS, 5, 0, 0, 0)
		d, ok, _ := tr.InsertWithSnapshot(snapSeq(0, 16), []uint32{10}, nil, snapBS, 8, 0, 0, 0)
		wantSlot(t, "displaced", d, ok, 5)
		if tr.SnapshotCount() != 1 {
			t.Fatalf("count %d", tr.SnapshotCount())
		}
		wantAnchor(t, snapLookup(tr, snapSeq(0, 16), 0, 0), 16, 8, 16)
	})
	t.Run("vision-pad collision (documents the hazard of token-id keys)", func(t *testing.T) {
		const pad = 151655
		image := func() []uint32 {
			out := []uint32{1, 2, 3}
			for range 29 {
				out = append(out, pad)
			}
			return out
		}
		tr := NewRadixTree(Options{})
		tr.InsertWithSnapshot(image(), []uint32{10, 20}, nil, snapBS, 77, 0, 0, 0)
		m := snapLookup(tr, image(), 0, 0) // another image behind the same pad run
		if !slices.Equal(m.MatchedBlocks, []uint32{10, 20}) {
			t.Fatalf("blocks %v", m.MatchedBlocks)
		}
		wantAnchor(t, m, 32, 77, 32)
	})
}

func TestTreeSnapshotScenarios(t *testing.T) { // snapshot.rs
	t.Run("1 plain insert has no anchor", func(t *testing.T) {
		tr := NewRadixTree(Options{})
		tr.Insert(snapSeq(0, 16), []uint32{10}, nil, snapBS, 0, 0)
		wantNoAnchor(t, snapLookup(tr, snapSeq(0, 16), 0, 0), 16)
	})
	t.Run("2 intermediate", func(t *testing.T) {
		tr := NewRadixTree(Options{})
		tr.Insert(snapSeq(0, 64), []uint32{10, 20, 30, 40}, nil, snapBS, 0, 0)
		tr.InsertIntermediateSnapshot(snapSeq(0, 32), nil, nil, 0, 50, 0, 0, 0)
		wantAnchor(t, snapLookup(tr, snapSeq(0, 64), 0, 0), 64, 50, 32)
	})
	t.Run("3 deepest wins", func(t *testing.T) {
		tr := NewRadixTree(Options{})
		tr.InsertWithSnapshot(snapSeq(0, 64), []uint32{10, 20, 30, 40}, nil, snapBS, 99, 0, 0, 0)
		tr.InsertIntermediateSnapshot(snapSeq(0, 32), nil, nil, 0, 50, 0, 0, 0)
		wantAnchor(t, snapLookup(tr, snapSeq(0, 64), 0, 0), 64, 99, 64)
	})
	t.Run("4 partial-prefix hit", func(t *testing.T) {
		tr := NewRadixTree(Options{})
		tr.Insert(snapSeq(0, 64), []uint32{10, 20, 30, 40}, nil, snapBS, 0, 0)
		tr.InsertIntermediateSnapshot(snapSeq(0, 32), nil, nil, 0, 50, 0, 0, 0)
		wantAnchor(t, snapLookup(tr, snapCat(snapSeq(0, 48), snapSeq(900, 916)), 0, 0), 48, 50, 32)
	})
	t.Run("5 intermediate survives tree eviction", func(t *testing.T) {
		tr := NewRadixTree(Options{})
		tr.Insert(snapSeq(0, 32), []uint32{10, 20}, nil, snapBS, 0, 0)
		tr.Release(snapSeq(0, 32), snapBS, 0)
		tr.InsertIntermediateSnapshot(snapSeq(0, 32), nil, nil, 0, 50, 0, 0, 0)
		for _, want := range []uint32{20, 10} {
			if ev := tr.Evict(1); !slices.Equal(ev.Physical, []uint32{want}) {
				t.Fatalf("evict = %v, want [%d]", ev.Physical, want)
			}
		}
		if tr.SnapshotCount() != 1 {
			t.Fatalf("count %d", tr.SnapshotCount())
		}
		s, ok := tr.EvictSnapshotLRU()
		wantSlot(t, "EvictSnapshotLRU", s, ok, 50)
	})
	armed := Options{SubBlockMatching: true}
	t.Run("6 armed partial suffix", func(t *testing.T) {
		tr := NewRadixTree(armed)
		tr.Insert(snapSeq(0, 20), []uint32{10, 20}, nil, snapBS, 0, 0)
		if m := snapLookup(tr, snapSeq(0, 20), 0, 0); m.MatchedTokens != 20 || !slices.Equal(m.MatchedBlocks, []uint32{10, 20}) {
			t.Fatalf("20 tokens: %d %v", m.MatchedTokens, m.MatchedBlocks)
		}
		for _, q := range [][]uint32{snapCat(snapSeq(0, 16), snapSeq(700, 704)), snapSeq(0, 32), snapSeq(0, 16)} {
			if m := snapLookup(tr, q, 0, 0); m.MatchedTokens != 16 || !slices.Equal(m.MatchedBlocks, []uint32{10}) {
				t.Fatalf("%d-token query: %d %v", len(q), m.MatchedTokens, m.MatchedBlocks)
			}
		}
	})
	t.Run("7 not armed: evict returns the partial too", func(t *testing.T) {
		tr := NewRadixTree(Options{})
		tr.Insert(snapSeq(0, 20), []uint32{10, 20}, nil, snapBS, 0, 0)
		tr.Release(snapSeq(0, 20), snapBS, 0)
		ev := tr.Evict(1)
		slices.Sort(ev.Physical)
		if !slices.Equal(ev.Physical, []uint32{10, 20}) {
			t.Fatalf("evict = %v", ev.Physical)
		}
	})
	t.Run("8 armed partial cleared by a real child", func(t *testing.T) {
		tr := NewRadixTree(armed)
		if acq := tr.Insert(snapSeq(0, 20), []uint32{10, 20}, nil, snapBS, 0, 0); !slices.Contains(acq.Blocks, 20) {
			t.Fatalf("acquired %v", acq.Blocks)
		}
		acq := tr.Insert(snapSeq(0, 32), []uint32{10, 30}, nil, snapBS, 0, 0)
		if !slices.Equal(acq.ReleasedBlocks, []uint32{20}) || !slices.Contains(acq.Blocks, 30) {
			t.Fatalf("second insert: %+v", acq)
		}
		for _, n := range []uint32{20, 32} {
			if m := snapLookup(tr, snapSeq(0, n), 0, 0); !slices.Equal(m.MatchedBlocks, []uint32{10, 30}) {
				t.Fatalf("%d tokens: %v", n, m.MatchedBlocks)
			}
		}
	})
	t.Run("9 armed multi-block", func(t *testing.T) {
		tr := NewRadixTree(armed)
		blocks := make([]uint32, 25)
		for i := range blocks {
			blocks[i] = uint32(i)
		}
		tr.Insert(snapSeq(0, 396), blocks, nil, snapBS, 0, 0)
		if m := snapLookup(tr, snapSeq(0, 396), 0, 0); m.MatchedTokens != 396 || !slices.Equal(m.MatchedBlocks, blocks) {
			t.Fatalf("%d %v", m.MatchedTokens, m.MatchedBlocks)
		}
	})
	for _, c := range []struct {
		name  string
		donor int
		bt    []uint32
	}{{"10 armed shorter lookup via the partial", 31, []uint32{10, 20}}, {"11 armed child-key arm", 35, []uint32{10, 20, 30}}} {
		t.Run(c.name, func(t *testing.T) {
			tr := NewRadixTree(armed)
			tr.Insert(snapSeq(0, uint32(c.donor)), c.bt, nil, snapBS, 0, 0)
			if m := snapLookup(tr, snapSeq(0, 22), 0, 0); m.MatchedTokens != 22 || !slices.Equal(m.MatchedBlocks, []uint32{10, 20}) {
				t.Fatalf("%d %v", m.MatchedTokens, m.MatchedBlocks)
			}
		})
	}
	t.Run("12 sub-block only", func(t *testing.T) {
		tr := NewRadixTree(armed)
		tr.Insert(snapSeq(0, 10), []uint32{10}, nil, snapBS, 0, 0)
		if e, c := tr.Stats(); e != 0 || c != 0 {
			t.Fatalf("stats (%d,%d)", e, c)
		}
		if m := snapLookup(tr, snapSeq(0, 10), 0, 0); m.MatchedTokens != 0 {
			t.Fatalf("matched %d", m.MatchedTokens)
		}
	})
	// Items 13 and 14 are TestPrefixHashProperties and TestSnapshotIndexAdapterIsolation.
	t.Run("15 adapter isolation through the tree", func(t *testing.T) {
		tr := NewRadixTree(Options{})
		const a, b = 0xA, 0xB
		tr.InsertWithSnapshot(snapSeq(0, 32), []uint32{10, 20}, nil, snapBS, 1, 0, 0, a)
		tr.Insert(snapSeq(0, 32), []uint32{30, 40}, nil, snapBS, 0, b)
		wantNoAnchor(t, snapLookup(tr, snapSeq(0, 32), 0, b), 32)
		wantAnchor(t, snapLookup(tr, snapSeq(0, 32), 0, a), 32, 1, 32)
	})
}

func TestTreeSnapshotTierLifeCycle(t *testing.T) { // snapshot_reap.rs case 1
	tr := NewRadixTree(Options{})
	tokens := snapSeq(0, 64)
	tr.InsertWithSnapshot(tokens, []uint32{1, 2, 3, 4}, nil, snapBS, 99, 7, 0, 0)
	wantAnchor(t, snapLookup(tr, tokens, 7, 0), 64, 99, 64)
	key := prefixHash(tokens, 64, 0)
	te, ok := tr.EvictSnapshotToTier(0)
	if !ok || te != (TierEvict{Spill: true, Slot: 99, Key: key, Depth: 64}) {
		t.Fatalf("spill = %+v %v", te, ok)
	}
	m := snapLookup(tr, tokens, 7, 0)
	if !m.HasSSMSnapshotTier || m.SSMSnapshotTierKey != key || m.SSMSnapshotTierToks != 64 || m.HasSSMSnapshot || m.SSMSnapshotTokens != 0 {
		t.Fatalf("after spill: %+v", m)
	}
	if !tr.PromoteSnapshot(key, 123) {
		t.Fatal("promote failed")
	}
	wantAnchor(t, snapLookup(tr, tokens, 7, 0), 64, 123, 64)
	if tr.PromoteSnapshot(key, 124) { // CONTRACT.md, "Decisions": a resident entry is not overwritten
		t.Fatal("promote on a resident entry succeeded")
	}
	if tr.ForgetSnapshotTierKey(key) { // resident: refused
		t.Fatal("forget of a resident entry succeeded")
	}
	if te, ok := tr.EvictSnapshotToTier(0); !ok || te.Slot != 123 {
		t.Fatalf("second spill = %+v", te)
	}
	if !tr.ForgetSnapshotTierKey(key) || tr.ForgetSnapshotTierKey(key) {
		t.Fatal("forget: want true then false")
	}
	wantNoAnchor(t, snapLookup(tr, tokens, 7, 0), 64)
	st := tr.SnapshotStats()
	want := SnapshotStats{Saves: 1, Lookups: 4, Hits: 3, AnchorDepthSum: 192, RecomputeTokensOnMiss: 64,
		TierSpills: 2, TierHits: 1, TierFaultIns: 1, TierReaps: 1}
	if st != want {
		t.Fatalf("stats %+v, want %+v", st, want)
	}
}

func TestTreeSnapshotNoPrefixCaching(t *testing.T) { // snapshot_reap.rs case 2
	c := NoPrefixCaching
	if _, ok := c.EvictSnapshotToTier(0); ok || c.PromoteSnapshot(1, 2) || c.ForgetSnapshotTierKey(1) {
		t.Fatal("NoPrefixCaching tier defaults")
	}
}

// TestTreeSnapshotTailAndSibling drives the tail path through the tree: the tail is restorable by
// its own session only, the sibling by everyone, and the next tail sweeps both.
func TestTreeSnapshotTailAndSibling(t *testing.T) {
	tr := NewRadixTree(Options{})
	tokens := snapSeq(0, 70)
	tr.Insert(tokens, []uint32{1, 2, 3, 4, 5}, nil, snapBS, 0, 0)
	if got := tr.InsertTailSnapshot(tokens[:64], 1, 9, 0); len(got) != 0 {
		t.Fatalf("first tail displaced %v", got)
	}
	if d, ok := tr.InsertTailSiblingSnapshot(tokens[:48], 2, 9, 0); ok {
		t.Fatalf("sibling displaced %d", d)
	}
	m := snapLookup(tr, tokens, 9, 0)
	wantAnchor(t, m, 64, 1, 64)
	if !m.SSMSnapshotIsTail {
		t.Fatal("tail flag missing")
	}
	m = snapLookup(tr, tokens, 8, 0) // another session falls back to the sibling
	wantAnchor(t, m, 64, 2, 48)
	if m.SSMSnapshotIsTail {
		t.Fatal("sibling reported as a tail")
	}
	got := tr.InsertTailSnapshot(tokens[:32], 3, 9, 0)
	slices.Sort(got)
	if !slices.Equal(got, []int{1, 2}) || tr.SnapshotCount() != 1 {
		t.Fatalf("sweep displaced %v, count %d", got, tr.SnapshotCount())
	}
	if !tr.EvictSnapshotSlot(3) || tr.EvictSnapshotSlot(3) || tr.SnapshotCount() != 0 {
		t.Fatal("EvictSnapshotSlot")
	}
}

// snapReclaim is the engine's reclaim_for_prompt (CONTRACT.md, "PinPrefix"): pin the
// prompt's cached prefix, evict until enough blocks are free or nothing is left, unpin. needed is
// the request's block count (prompt and output), as the engine computes it.
func snapReclaim(tr *RadixTree, prompt []uint32, needed, free int) (target, freeAfter int) {
	m := tr.PinPrefix(prompt, snapBS, 0)
	target = max(needed-m/snapBS, 0)
	for free < target {
		ev := tr.Evict(target - free)
		if ev.IsEmpty() {
			break
		}
		free += ev.Len()
	}
	tr.ReleaseMatched(prompt, snapBS, m, 0)
	return target, free
}

func TestTreeSnapshotReclaim(t *testing.T) { // prefix_reclaim_tests.rs, the snapshot parts; a 10-block pool
	cached := snapSeq(0, 96)
	setup := func() *RadixTree {
		tr := NewRadixTree(Options{})
		tr.Insert(cached, []uint32{0, 1, 2, 3, 4, 5}, nil, snapBS, 0, 0)
		tr.Release(cached, snapBS, 0) // the cache holds the only ref
		tr.InsertIntermediateSnapshot(cached[:48], nil, nil, 0, 48, 1, 0, 0)
		tr.InsertIntermediateSnapshot(cached, nil, nil, 0, 96, 1, 0, 0)
		return tr
	}
	t.Run("warm admission keeps the prefix and its anchor", func(t *testing.T) {
		tr := setup()
		warm := snapCat(cached, snapSeq(5000, 5004))
		if target, free := snapReclaim(tr, warm, 7, 4); target != 1 || free != 4 {
			t.Fatalf("reclaim = {target %d, free %d}", target, free)
		}
		if p := tr.PeekMatchedTokens(warm, snapBS, 0); p != 96 {
			t.Fatalf("peek %d", p)
		}
		wantAnchor(t, snapLookup(tr, warm, 1, 0), 96, 96, 96)
	})
	t.Run("a tail that cannot fit evicts others only", func(t *testing.T) {
		tr := setup()
		other := snapSeq(9000, 9016)
		tr.Insert(other, []uint32{6}, nil, snapBS, 0, 0)
		tr.Release(other, snapBS, 0)
		warm := snapCat(cached, snapSeq(5000, 5080))
		if target, free := snapReclaim(tr, warm, 12, 3); target != 6 || free != 4 {
			t.Fatalf("reclaim = {target %d, free %d}", target, free)
		}
		if tr.PeekMatchedTokens(other, snapBS, 0) != 0 || tr.PeekMatchedTokens(warm, snapBS, 0) != 96 {
			t.Fatal("the wrong entry was evicted")
		}
		if ev := tr.Evict(6); ev.Len() != 6 {
			t.Fatalf("evict(6) = %v", ev.Physical)
		}
		if tr.SnapshotCount() != 2 { // tree eviction never touches snapshots
			t.Fatalf("snapshot count %d", tr.SnapshotCount())
		}
	})
	t.Run("an empty prompt reserves everything; the shallower anchor still serves", func(t *testing.T) {
		tr := setup()
		if target, free := snapReclaim(tr, nil, 7, 4); target != 7 || free != 7 {
			t.Fatalf("reclaim = {target %d, free %d}", target, free)
		}
		if p := tr.PeekMatchedTokens(cached, snapBS, 0); p != 48 {
			t.Fatalf("peek %d", p)
		}
		wantAnchor(t, snapLookup(tr, cached, 1, 0), 48, 48, 48)
	})
}

func TestTreeSnapshotDecisions(t *testing.T) { // not in the reference: CONTRACT.md, "Decisions"
	tr := NewRadixTree(Options{})
	tokens := snapSeq(0, 32)
	tr.InsertWithSnapshot(tokens, []uint32{1, 2}, nil, snapBS, 5, 0, 0, 0)
	if d, ok, _ := tr.InsertWithSnapshot(tokens, []uint32{1, 2}, nil, snapBS, 5, 0, 0, 0); ok {
		t.Fatalf("re-registering slot 5 displaced %d", d)
	}
	if d, ok := tr.InsertIntermediateSnapshot(tokens, nil, nil, 0, 5, 0, 0, 0); ok {
		t.Fatalf("re-registering slot 5 displaced %d", d)
	}
	if tr.PromoteSnapshot(prefixHash(tokens, 32, 0), 6) {
		t.Fatal("promote on a resident entry succeeded")
	}
	wantAnchor(t, snapLookup(tr, tokens, 0, 0), 32, 5, 32)
	// Invalid input changes nothing: bad tree arguments or a negative slot.
	for _, c := range []struct {
		bt, disks []uint32
		bs, slot  int
	}{{[]uint32{1, 2}, nil, 0, 9}, {[]uint32{1, NoBlock}, nil, snapBS, 9}, {[]uint32{1, 2}, []uint32{7}, snapBS, 9}, {[]uint32{3, 4}, nil, snapBS, -1}} {
		other := snapSeq(100, 132)
		if d, ok, acq := tr.InsertWithSnapshot(other, c.bt, c.disks, c.bs, c.slot, 0, 0, 0); ok || d != 0 || len(acq.Blocks) != 0 {
			t.Fatalf("invalid %+v accepted", c)
		}
	}
	if tr.SnapshotCount() != 1 || tr.PeekMatchedTokens(snapSeq(100, 132), snapBS, 0) != 0 {
		t.Fatal("invalid input changed the cache")
	}
	if _, ok := tr.InsertIntermediateSnapshot(tokens, nil, nil, 0, -1, 0, 0, 0); ok || tr.InsertTailSnapshot(tokens, -1, 1, 0) != nil {
		t.Fatal("negative slot accepted")
	}
	if _, ok := tr.InsertTailSiblingSnapshot(tokens, -1, 1, 0); ok || tr.EvictSnapshotSlot(-1) || tr.SnapshotCount() != 1 {
		t.Fatal("negative slot accepted")
	}
}

// TestTreeSnapshotConcurrent exercises both locks from several goroutines (run with -race): the
// tree half and the index half of a lookup are separate critical sections.
func TestTreeSnapshotConcurrent(t *testing.T) {
	tr := NewRadixTree(Options{})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 300 {
				n := uint32(16 * (1 + i%4))
				tokens := snapSeq(uint32(g%2)*1000, uint32(g%2)*1000+n)
				blocks := make([]uint32, n/16)
				for j := range blocks {
					blocks[j] = uint32(g*10_000 + i*10 + j)
				}
				slot := g*10_000 + i
				switch i % 6 {
				case 0, 1:
					tr.InsertWithSnapshot(tokens, blocks, nil, snapBS, slot, uint64(g), 0, 0)
					tr.Release(tokens, snapBS, 0)
				case 2:
					snapLookup(tr, tokens, uint64(g), 0)
				case 3:
					tr.InsertTailSnapshot(tokens, slot, uint64(g+1), 0)
				case 4:
					if te, ok := tr.EvictSnapshotToTier(0); ok && te.Spill {
						tr.PromoteSnapshot(te.Key, slot)
					}
				default:
					tr.EvictSnapshotLRU()
					tr.Evict(1)
				}
			}
		})
	}
	wg.Wait()
	tr.snap.mu.Lock()
	defer tr.snap.mu.Unlock()
	checkSnapshotStructure(t, tr.snap)
}
