package local

import (
	"slices"
	"testing"
)

// Victim choice and the tail lease: the reference's snapshot_lease.rs.

func evictWant(t *testing.T, x *snapshotIndex, want int) {
	t.Helper()
	s, ok := x.evictLRU()
	wantSlot(t, "evictLRU", s, ok, want)
}

func TestLeaseProtectsLiveTail(t *testing.T) { // snapshot_lease.rs case 1
	x := newSnapshotIndex(Options{})
	snapFix(x, 9, 1, 10, 40, snapTail)
	snapFix(x, 7, 1, 10, 50, snapPlain)
	x.lastLookupSession = 1
	evictWant(t, x, 7)
}

func TestLeaseFinishLeafNotProtected(t *testing.T) { // snapshot_lease.rs case 2
	x := newSnapshotIndex(Options{})
	snapFix(x, 6, 1, 100, 95, snapPlain)
	snapFix(x, 7, 1, 6080, 50, snapPlain)
	snapFix(x, 9, 1, 6000, 40, snapTail)
	x.lastLookupSession = 1
	evictWant(t, x, 7)
}

func TestLeaseDormantSessionFirst(t *testing.T) { // snapshot_lease.rs case 3
	x := newSnapshotIndex(Options{})
	snapFix(x, 2, 2, 10, 20, snapPlain)
	snapFix(x, 3, 2, 10, 5, snapTail)
	snapFix(x, 1, 1, 10, 10, snapTail) // dormant session 1's tail
	x.lastLookupSession = 2
	evictWant(t, x, 1)
}

func TestLeaseSingleEntryEvictable(t *testing.T) { // snapshot_lease.rs case 4
	x := newSnapshotIndex(Options{})
	snapFix(x, 9, 1, 10, 40, snapTail)
	x.lastLookupSession = 1
	if !x.tailLeaseActiveLocked() {
		t.Fatal("lease inactive")
	}
	evictWant(t, x, 9)
}

func TestLeaseExpires(t *testing.T) { // snapshot_lease.rs case 5
	x := newSnapshotIndex(Options{TailLeaseTTL: 5})
	snapFix(x, 9, 1, 10, 10, snapTail)
	snapFix(x, 7, 2, 10, 5, snapPlain)
	x.lastLookupSession = 1
	evictWant(t, x, 7)
	snapFix(x, 8, 2, 10, 20, snapPlain)
	x.evictionsSinceLookup = 5
	evictWant(t, x, 9)
}

func TestPlainOverTailClearsFlag(t *testing.T) { // snapshot_lease.rs case 6
	x := newSnapshotIndex(Options{})
	x.insertTail(5, 1, 3, 10)
	d, ok := x.insert(5, 2, 3, 10)
	wantSlot(t, "displaced", d, ok, 1)
	if e, _ := snapEntryFor(x, 5); e.isTail || e.isTailSibling {
		t.Fatalf("flags survived: %+v", e)
	}
}

func TestTailGateThroughLookupTiered(t *testing.T) { // snapshot_lease.rs case 7
	x := newSnapshotIndex(Options{})
	x.insertTail(snapKey(32), 4, 7, 32)
	if m, ok := x.lookupTiered(snapToks, 40, 7, 0); !ok || m.slot != 4 || !m.isTail {
		t.Fatalf("own session: %+v %v", m, ok)
	}
	for _, s := range []uint64{8, 0} {
		if _, ok := x.lookupTiered(snapToks, 40, s, 0); ok {
			t.Fatalf("session %d restored another session's tail", s)
		}
	}
}

func TestAlphaZeroIsLRU(t *testing.T) { // snapshot_lease.rs case 8
	x := newSnapshotIndex(Options{})
	snapFix(x, 1, 1, 20000, 50, snapPlain)
	snapFix(x, 2, 1, 100, 60, snapPlain)
	evictWant(t, x, 1)
}

func TestAlphaTwo(t *testing.T) { // snapshot_lease.rs case 9
	x := newSnapshotIndex(Options{SnapshotEvictAlpha: 2})
	snapFix(x, 1, 1, 20000, 50, snapPlain)
	snapFix(x, 2, 1, 100, 60, snapPlain)
	evictWant(t, x, 2) // the shallow, fresher one: deep entries are kept

	x = newSnapshotIndex(Options{SnapshotEvictAlpha: 2})
	snapFix(x, 1, 1, 20000, 50, snapPlain)
	snapFix(x, 2, 1, 100, 60, snapPlain)
	snapFix(x, 3, 2, 20000, 40, snapPlain) // stalest session, deep
	evictWant(t, x, 3)
}

func TestLeaseCoversSibling(t *testing.T) { // snapshot_lease.rs case 10
	x := newSnapshotIndex(Options{})
	snapFix(x, 1, 1, 10, 5, snapSibling)
	snapFix(x, 2, 1, 10, 40, snapTail)
	snapFix(x, 3, 1, 10, 50, snapPlain)
	x.lastLookupSession = 1
	evictWant(t, x, 3)
}

func TestNewTailSweeps(t *testing.T) { // snapshot_lease.rs case 11
	x := newSnapshotIndex(Options{})
	x.insertTail(snapKey(32), 1, 7, 32)
	x.insertTailSibling(snapKey(16), 2, 7, 16)
	got := x.insertTail(snapKey(48), 3, 7, 48)
	slices.Sort(got)
	if !slices.Equal(got, []int{1, 2}) || x.count() != 1 {
		t.Fatalf("displaced %v, count %d", got, x.count())
	}
}

func TestOnlyLeasedStillEvicts(t *testing.T) { // snapshot_lease.rs case 12
	x := newSnapshotIndex(Options{})
	x.insertTail(snapKey(32), 1, 7, 32)
	x.insertTailSibling(snapKey(16), 2, 7, 16)
	x.lookupTiered(snapToks, 0, 7, 0)
	if !x.tailLeaseActiveLocked() {
		t.Fatal("lease inactive")
	}
	evictWant(t, x, 1)
	if x.count() != 1 {
		t.Fatalf("count %d", x.count())
	}
}

func TestSiblingNotGated(t *testing.T) { // snapshot_lease.rs case 13
	x := newSnapshotIndex(Options{})
	x.insertTailSibling(snapKey(16), 2, 7, 16)
	for _, s := range []uint64{7, 0, 8} {
		if m, ok := x.lookupTiered(snapToks, 20, s, 0); !ok || m.slot != 2 || m.isTail {
			t.Fatalf("session %d: %+v %v", s, m, ok)
		}
	}
}

func TestPlainOverSiblingClearsFlag(t *testing.T) { // snapshot_lease.rs case 14
	x := newSnapshotIndex(Options{})
	x.insertTailSibling(5, 1, 3, 10)
	x.insert(5, 2, 3, 10)
	if e, _ := snapEntryFor(x, 5); e.isTailSibling || e.isTail {
		t.Fatalf("flags survived: %+v", e)
	}
}

// TestLeaseSessionZeroTailNeverLeased: a tail registered with session 0 is never leased (and
// never restorable), and piles up without a sweep (parity).
func TestLeaseSessionZeroTail(t *testing.T) {
	x := newSnapshotIndex(Options{})
	x.insertTail(1, 1, 0, 10)
	x.insertTail(2, 2, 0, 10)
	if x.count() != 2 || x.stats.Saves != 0 {
		t.Fatalf("count %d saves %d", x.count(), x.stats.Saves)
	}
	x.lastLookupSession = 0
	evictWant(t, x, 1)
}

// TestVictimFullTieListOrder: equal freshness and score keep list order.
func TestVictimFullTieListOrder(t *testing.T) {
	x := newSnapshotIndex(Options{})
	snapFix(x, 4, 1, 10, 7, snapPlain)
	snapFix(x, 3, 1, 10, 7, snapPlain)
	evictWant(t, x, 4)
}

// TestVictimTiedSessions: sessions of equal freshness (possible only with hand-set recency) compete
// on score, as the pair (freshness, score) orders them.
func TestVictimTiedSessions(t *testing.T) {
	x := newSnapshotIndex(Options{})
	snapFix(x, 1, 1, 10, 10, snapPlain)
	snapFix(x, 2, 1, 10, 3, snapPlain)
	snapFix(x, 3, 2, 10, 10, snapPlain)
	snapFix(x, 4, 2, 10, 1, snapPlain)
	snapFix(x, 5, 3, 10, 11, snapPlain)
	evictWant(t, x, 4)
}
