package local

import (
	"slices"
	"testing"
)

func events(t *testing.T, tr *RadixTree, since uint64) []SummaryEvent {
	t.Helper()
	ev, _, ok := tr.SummarySince(since, nil)
	if !ok {
		t.Fatalf("SummarySince(%d) not ok", since)
	}
	return ev
}

func TestJournalEvents(t *testing.T) {
	tr := NewRadixTree(Options{})
	a := toks(0, 48)
	h := BlockHashes(a, bs, 0)
	if tr.SummaryHead() != 0 {
		t.Fatal("head of an empty tree")
	}
	tr.Insert(a, []uint32{1, 2, 3}, nil, bs, 0, 0)
	want := []SummaryEvent{{1, h[0], true}, {2, h[1], true}, {3, h[2], true}}
	if got := events(t, tr, 0); !slices.Equal(got, want) {
		t.Fatalf("insert events %v, want %v", got, want)
	}
	// Re-insert, lookup, pin, release: no visibility change, no events.
	tr.Insert(a, []uint32{1, 2, 3}, nil, bs, 0, 0)
	tr.Lookup(a, bs, 0, 0)
	tr.ReleaseMatched(a, bs, 48, 0)
	tr.Release(a, bs, 0)
	tr.Release(a, bs, 0)
	if head := tr.SummaryHead(); head != 3 {
		t.Fatalf("head %d after ref churn", head)
	}
	// Over-release of the first block hides it and every descendant walk reached through it.
	tr.ReleaseMatched(a, bs, 32, 0) // refs: 0, 0, 1
	got := events(t, tr, 3)
	if len(got) != 3 || got[0] != (SummaryEvent{4, h[0], false}) || got[1] != (SummaryEvent{5, h[1], false}) ||
		got[2] != (SummaryEvent{6, h[2], false}) {
		t.Fatalf("over-release events %v", got)
	}
	if hs := sortedHashes(tr); len(hs) != 0 {
		t.Fatalf("visible %v after hiding the root's child", hs)
	}
	// Re-inserting the first block restores it and the descendant that is reachable again.
	tr.Insert(a[:16], []uint32{1}, nil, bs, 16, 0)
	got = events(t, tr, 6)
	if len(got) != 1 || got[0] != (SummaryEvent{7, h[0], true}) {
		t.Fatalf("restore events %v", got)
	}
	tr.Insert(a[:32], []uint32{1, 2}, nil, bs, 32, 0)
	got = events(t, tr, 7)
	if len(got) != 2 || !got[0].Added || !got[1].Added || got[0].Hash != h[1] || got[1].Hash != h[2] {
		t.Fatalf("restore cascade events %v", got)
	}
	// Eviction removes leaf-first.
	ev := tr.Evict(3)
	eq(t, "evict", ev.Physical, []uint32{3, 2, 1})
	got = events(t, tr, 9)
	if len(got) != 3 || got[0].Hash != h[2] || got[1].Hash != h[1] || got[2].Hash != h[0] || got[0].Added {
		t.Fatalf("evict events %v", got)
	}
	// Add then remove of the same hash: both are emitted, in order.
	tr.Insert(a[:16], []uint32{9}, nil, bs, 16, 0)
	tr.Evict(1)
	got = events(t, tr, 12)
	if len(got) != 2 || got[0] != (SummaryEvent{13, h[0], true}) || got[1] != (SummaryEvent{14, h[0], false}) {
		t.Fatalf("add/remove events %v", got)
	}
	r := newSummaryReplica()
	if err := r.sync(tr); err != nil || len(r.set) != 0 || r.seq != 14 {
		t.Fatalf("replay: %v, %d hashes at %d", err, len(r.set), r.seq)
	}
}

func TestJournalAdapterSeed(t *testing.T) {
	tr := NewRadixTree(Options{})
	tr.Insert(toks(0, 32), []uint32{1, 2}, nil, bs, 0, 0)
	tr.Insert(toks(0, 32), []uint32{3, 4}, nil, bs, 0, 42)
	want := append(BlockHashes(toks(0, 32), bs, 0), BlockHashes(toks(0, 32), bs, 42)...)
	slices.Sort(want)
	if got := sortedHashes(tr); !slices.Equal(got, want) {
		t.Fatalf("summary %x, want %x (router-computable hashes)", got, want)
	}
}

func TestJournalRing(t *testing.T) {
	tr := NewRadixTree(Options{JournalCapacity: 4})
	tr.Insert(toks(0, 16*6), []uint32{1, 2, 3, 4, 5, 6}, nil, bs, 0, 0) // 6 events, ring keeps 3..6
	if _, head, ok := tr.SummarySince(1, nil); ok || head != 6 {
		t.Fatalf("since 1: ok=%v head=%d, want fallen out", ok, head)
	}
	if ev, head, ok := tr.SummarySince(2, nil); !ok || head != 6 || len(ev) != 4 || ev[0].Seq != 3 {
		t.Fatalf("since 2: %v %d %v", ev, head, ok)
	}
	if ev, _, ok := tr.SummarySince(6, nil); !ok || len(ev) != 0 {
		t.Fatalf("since head: %v %v", ev, ok)
	}
	if _, _, ok := tr.SummarySince(7, nil); ok {
		t.Fatal("since > head accepted")
	}
	hs, head := tr.SummarySnapshot(nil)
	if head != 6 || len(hs) != 6 {
		t.Fatalf("snapshot %d hashes at %d", len(hs), head)
	}
	// A replica that falls behind resynchronises from a snapshot and then follows events.
	r := newSummaryReplica()
	if err := r.sync(tr); err != nil || len(r.set) != 6 {
		t.Fatalf("resync: %v", err)
	}
	tr.Release(toks(0, 96), bs, 0)
	tr.Evict(2)
	if err := r.sync(tr); err != nil || len(r.set) != 4 {
		t.Fatalf("follow: %v, %d", err, len(r.set))
	}
}

func TestJournalMixedBlockSizes(t *testing.T) {
	// A 16-token node under a 32-token node is reachable by no walk: not in the summary.
	tr := NewRadixTree(Options{})
	tr.Insert(toks(0, 32), []uint32{1}, nil, 32, 0, 0)
	tr.mu.Lock()
	parent := tr.children.get(tr.nodes, ChainHash(0, toks(0, 32)))
	h := ChainHash(tr.nodes[parent].hash, toks(32, 48))
	tr.newChild(parent, h, toks(32, 48), 2, NoBlock, 1, 1)
	tr.mu.Unlock()
	if got := sortedHashes(tr); len(got) != 1 {
		t.Fatalf("summary %d hashes, want 1", len(got))
	}
	mustStructure(t, tr)
}
