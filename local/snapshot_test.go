package local

import (
	"slices"
	"testing"
)

// Index unit tests: the reference's snapshot_index.rs, snapshot_insert_tier.rs and the index half
// of snapshot_reap.rs. Fixtures built with snapFix use
// key = slot and an explicit recency, and set the live session directly, as the reference's do.

func snapFix(x *snapshotIndex, slot int, session uint64, depth int, recency uint64, kind snapKind) {
	x.pushLocked(snapEntry{
		slot: slot, session: session, tokenCount: depth, key: uint64(slot), lastAccess: recency,
		isTail: kind == snapTail, isTailSibling: kind == snapSibling,
	})
	x.clock = max(x.clock, recency)
}

// snapEntryFor returns a copy of the entry under key, and whether it exists.
func snapEntryFor(x *snapshotIndex, key uint64) (snapEntry, bool) {
	i, ok := x.byKey[key]
	if !ok {
		return snapEntry{}, false
	}
	return x.entries[i], true
}

func wantSlot(t *testing.T, what string, got int, ok bool, want int) {
	t.Helper()
	if !ok || got != want {
		t.Fatalf("%s = (%d, %v), want (%d, true)", what, got, ok, want)
	}
}

func wantNone(t *testing.T, what string, got int, ok bool) {
	t.Helper()
	if ok {
		t.Fatalf("%s = %d, want none", what, got)
	}
}

var snapToks = snapSeq(1000, 1000+20000)

func snapKey(n int) uint64 { return prefixHash(snapToks, n, 0) }

func TestSnapshotLeaseOnOff(t *testing.T) { // snapshot_index.rs case 1
	for _, off := range []bool{true, false} {
		x := newSnapshotIndex(Options{DisableTailLease: off})
		snapFix(x, 7, 1, 10, 50, snapPlain)
		snapFix(x, 9, 1, 10, 40, snapTail)
		x.lastLookupSession = 1
		want := 7
		if off {
			want = 9
		}
		s, ok := x.evictLRU()
		wantSlot(t, "evictLRU", s, ok, want)
	}
}

func TestSnapshotEvictionIgnoresHitsButHitsRefresh(t *testing.T) { // snapshot_index.rs case 2
	x := newSnapshotIndex(Options{})
	x.insert(snapKey(40), 1, 7, 40)
	x.insert(snapKey(50), 4, 7, 50)
	for range 5 {
		m, ok := x.lookupTiered(snapToks, 40, 7, 0)
		wantSlot(t, "lookup", m.slot, ok, 1)
	}
	s, ok := x.evictLRU()
	wantSlot(t, "evictLRU", s, ok, 4)
	x.insert(snapKey(80), 2, 7, 80)
	x.insert(snapKey(90), 3, 7, 90)
	s, ok = x.evictLRU()
	wantSlot(t, "evictLRU", s, ok, 1)
}

func TestSnapshotOnlyWinnerRecencyMoves(t *testing.T) { // snapshot_index.rs case 3
	for _, resident := range []bool{false, true} {
		x := newSnapshotIndex(Options{})
		x.insert(snapKey(16), 1, 0, 16)
		x.insert(snapKey(32), 2, 0, 32)
		before, _ := snapEntryFor(x, snapKey(16))
		if resident {
			slot, depth, ok := x.lookupResident(snapToks, 48, 0, 0)
			if !ok || slot != 2 || depth != 32 {
				t.Fatalf("lookupResident = (%d,%d,%v)", slot, depth, ok)
			}
		} else if m, ok := x.lookupTiered(snapToks, 48, 0, 0); !ok || m.slot != 2 {
			t.Fatalf("lookupTiered = %+v %v", m, ok)
		}
		loser, _ := snapEntryFor(x, snapKey(16))
		winner, _ := snapEntryFor(x, snapKey(32))
		if loser.lastAccess != before.lastAccess || winner.lastAccess != x.clock {
			t.Fatalf("recency: loser %d (was %d), winner %d, clock %d", loser.lastAccess, before.lastAccess, winner.lastAccess, x.clock)
		}
	}
}

func TestSnapshotSessionLatch(t *testing.T) { // snapshot_index.rs case 4
	x := newSnapshotIndex(Options{})
	x.lookupResident(snapToks, 10, 42, 0)
	x.lookupResident(snapToks, 10, 0, 0)
	if x.lastLookupSession != 42 {
		t.Fatalf("latched %d, want 42", x.lastLookupSession)
	}
	x.evictionsSinceLookup = 7
	x.lookupTiered(snapToks, 10, 99, 0)
	if x.lastLookupSession != 99 || x.evictionsSinceLookup != 0 {
		t.Fatalf("latch %d evictions %d", x.lastLookupSession, x.evictionsSinceLookup)
	}
}

func TestSnapshotStats(t *testing.T) { // snapshot_index.rs case 5
	x := newSnapshotIndex(Options{})
	if _, ok := x.lookupTiered(snapToks, 100, 0, 0); ok {
		t.Fatal("cold lookup hit")
	}
	x.insert(snapKey(40), 3, 0, 40)
	m, ok := x.lookupTiered(snapToks, 100, 0, 0)
	if !ok || m.slot != 3 || m.tokenCount != 40 {
		t.Fatalf("hit = %+v %v", m, ok)
	}
	want := SnapshotStats{Saves: 1, Lookups: 2, Hits: 1, AnchorDepthSum: 40, RecomputeTokensOnHit: 60, RecomputeTokensOnMiss: 100}
	if got := x.snapshotStats(); got != want {
		t.Fatalf("stats %+v, want %+v", got, want)
	}
}

func TestSnapshotEvictToTierSpillsOlder(t *testing.T) { // snapshot_index.rs case 6
	x := newSnapshotIndex(Options{})
	snapFix(x, 9, 0, 100, 10, snapPlain)
	snapFix(x, 3, 0, 100, 20, snapPlain)
	te, ok := x.evictToTier(0)
	if !ok || te != (TierEvict{Spill: true, Slot: 9, Key: 9, Depth: 100}) {
		t.Fatalf("evictToTier = %+v %v", te, ok)
	}
	if x.count() != 2 || x.stats.TierSpills != 1 {
		t.Fatalf("count %d spills %d", x.count(), x.stats.TierSpills)
	}
	s, ok := x.evictLRU()
	wantSlot(t, "evictLRU", s, ok, 3)
}

func TestSnapshotEvictToTierDropsShallow(t *testing.T) { // snapshot_index.rs case 7
	x := newSnapshotIndex(Options{})
	snapFix(x, 9, 0, 100, 10, snapPlain)
	te, ok := x.evictToTier(1024)
	if !ok || te != (TierEvict{Slot: 9, Depth: 100}) {
		t.Fatalf("evictToTier = %+v %v", te, ok)
	}
	if x.count() != 0 || x.stats.Evictions != 1 || x.stats.TierSpills != 0 {
		t.Fatalf("count %d stats %+v", x.count(), x.stats)
	}
	if te, ok := x.evictToTier(1024); ok {
		t.Fatalf("empty index gave %+v", te)
	}
}

func TestSnapshotEvictToTierSpillsDeep(t *testing.T) { // snapshot_index.rs case 8, and depth == min spills
	for _, depth := range []int{16000, 1024} {
		x := newSnapshotIndex(Options{})
		snapFix(x, 9, 0, depth, 10, snapPlain)
		te, ok := x.evictToTier(1024)
		if !ok || te != (TierEvict{Spill: true, Slot: 9, Key: 9, Depth: depth}) {
			t.Fatalf("depth %d: evictToTier = %+v %v", depth, te, ok)
		}
	}
}

func TestSnapshotSpilledLookupAndPromote(t *testing.T) { // snapshot_index.rs cases 9 and 10
	x := newSnapshotIndex(Options{})
	ph := snapKey(32)
	x.insert(ph, 5, 0, 32)
	if te, ok := x.evictToTier(0); !ok || !te.Spill || te.Key != ph {
		t.Fatalf("spill = %+v", te)
	}
	if _, _, ok := x.lookupResident(snapToks, 48, 0, 0); ok {
		t.Fatal("resident-only lookup found a spilled entry")
	}
	m, ok := x.lookupTiered(snapToks, 48, 0, 0)
	if !ok || !m.tiered || m.tierKey != ph || m.tokenCount != 32 || m.slot != -1 {
		t.Fatalf("lookupTiered = %+v %v", m, ok)
	}
	if x.stats.TierHits != 1 {
		t.Fatalf("tier hits %d", x.stats.TierHits)
	}
	if !x.promote(ph, 12) || x.stats.TierFaultIns != 1 {
		t.Fatal("promote failed")
	}
	if slot, _, ok := x.lookupResident(snapToks, 48, 0, 0); !ok || slot != 12 {
		t.Fatalf("lookupResident after promote = %d %v", slot, ok)
	}
	if m, ok := x.lookupTiered(snapToks, 48, 0, 0); !ok || m.tiered || m.slot != 12 {
		t.Fatalf("lookupTiered after promote = %+v", m)
	}
}

func TestSnapshotEverythingSpilled(t *testing.T) { // snapshot_index.rs case 11
	x := newSnapshotIndex(Options{})
	snapFix(x, 1, 0, 10, 1, snapPlain)
	snapFix(x, 2, 0, 10, 2, snapPlain)
	for range 2 {
		if te, ok := x.evictToTier(0); !ok || !te.Spill {
			t.Fatalf("spill = %+v %v", te, ok)
		}
	}
	if te, ok := x.evictToTier(0); ok {
		t.Fatalf("evictToTier = %+v", te)
	}
	s, ok := x.evictLRU()
	wantNone(t, "evictLRU", s, ok)
	if x.evictionsSinceLookup != 2 {
		t.Fatalf("a victimless call must not count: %d", x.evictionsSinceLookup)
	}
}

func TestSnapshotReinsertUnspills(t *testing.T) { // snapshot_index.rs case 12
	x := newSnapshotIndex(Options{})
	x.insert(0xAA, 1, 0, 10)
	x.evictToTier(0)
	d, ok := x.insert(0xAA, 5, 0, 10)
	wantNone(t, "insert over spilled", d, ok)
	s, ok := x.evictLRU()
	wantSlot(t, "evictLRU", s, ok, 5)
}

func TestSnapshotRoundTrip(t *testing.T) { // snapshot_index.rs case 13
	x := newSnapshotIndex(Options{})
	x.insert(snapKey(32), 42, 0, 32)
	if slot, depth, ok := x.lookupResident(snapToks, 48, 0, 0); !ok || slot != 42 || depth != 32 {
		t.Fatalf("matched 48 = (%d,%d,%v)", slot, depth, ok)
	}
	if _, _, ok := x.lookupResident(snapToks, 31, 0, 0); ok {
		t.Fatal("matched 31 found a 32-deep anchor")
	}
}

func TestSnapshotPlainLRUOrder(t *testing.T) { // snapshot_index.rs case 14
	x := newSnapshotIndex(Options{})
	x.insert(snapKey(1), 1, 0, 1)
	x.insert(snapKey(2), 2, 0, 2)
	for _, want := range []int{1, 2} {
		s, ok := x.evictLRU()
		wantSlot(t, "evictLRU", s, ok, want)
	}
	s, ok := x.evictLRU()
	wantNone(t, "evictLRU", s, ok)
}

func TestSnapshotSessionIsolation(t *testing.T) { // snapshot_index.rs case 15
	x := newSnapshotIndex(Options{})
	k := snapKey(32)
	x.insert(k, 42, 100, 32)
	for _, s := range []uint64{200, 100, 0} {
		if m, ok := x.lookupTiered(snapToks, 32, s, 0); !ok || m.slot != 42 {
			t.Fatalf("plain entry, session %d: %+v %v", s, m, ok)
		}
	}
	if got := x.insertTail(k, 43, 100, 32); !slices.Equal(got, []int{42}) {
		t.Fatalf("insertTail displaced %v", got)
	}
	for _, s := range []uint64{200, 0} {
		if m, ok := x.lookupTiered(snapToks, 32, s, 0); ok {
			t.Fatalf("tail visible to session %d: %+v", s, m)
		}
	}
	if m, ok := x.lookupTiered(snapToks, 32, 100, 0); !ok || m.slot != 43 || !m.isTail {
		t.Fatalf("own session: %+v %v", m, ok)
	}
}

func TestSnapshotOverwrite(t *testing.T) { // snapshot_index.rs case 16
	x := newSnapshotIndex(Options{})
	x.insert(snapKey(16), 5, 0, 16)
	d, ok := x.insert(snapKey(16), 8, 0, 16)
	wantSlot(t, "displaced", d, ok, 5)
	if x.count() != 1 || x.stats.Saves != 1 {
		t.Fatalf("count %d saves %d", x.count(), x.stats.Saves)
	}
	if m, ok := x.lookupTiered(snapToks, 16, 0, 0); !ok || m.slot != 8 {
		t.Fatalf("lookup %+v", m)
	}
}

func TestSnapshotDeepestMatch(t *testing.T) { // snapshot_index.rs case 17
	x := newSnapshotIndex(Options{})
	x.insert(snapKey(16), 16, 0, 16)
	x.insert(snapKey(32), 32, 0, 32)
	for _, c := range []struct{ matched, want int }{{48, 32}, {20, 16}, {32, 32}, {15, -1}} {
		m, ok := x.lookupTiered(snapToks, c.matched, 0, 0)
		if c.want < 0 {
			if ok {
				t.Fatalf("matched %d hit %+v", c.matched, m)
			}
			continue
		}
		if !ok || m.slot != c.want || m.tokenCount != c.want {
			t.Fatalf("matched %d: %+v %v, want %d", c.matched, m, ok, c.want)
		}
	}
}

// TestSnapshotIndexAdapterIsolation is the reference's snapshot.rs case 14 at the index level.
func TestSnapshotIndexAdapterIsolation(t *testing.T) {
	x := newSnapshotIndex(Options{})
	const a = 0xA
	x.insert(prefixHash(snapToks, 32, a), 1, 0, 32)
	for _, ad := range []uint64{0xB, 0} {
		if m, ok := x.lookupTiered(snapToks, 32, 0, ad); ok {
			t.Fatalf("adapter %#x saw adapter A's entry: %+v", ad, m)
		}
	}
	if m, ok := x.lookupTiered(snapToks, 32, 0, a); !ok || m.slot != 1 {
		t.Fatalf("adapter A: %+v %v", m, ok)
	}
}

// TestSnapshotEmptyAnchor: a token count 0 entry is a depth-0 anchor for every matched >= 0.
func TestSnapshotEmptyAnchor(t *testing.T) {
	x := newSnapshotIndex(Options{})
	x.insert(prefixHash(nil, 0, 0), 3, 0, 0)
	m, ok := x.lookupTiered(snapToks, 50, 0, 0)
	if !ok || m.slot != 3 || m.tokenCount != 0 || x.stats.RecomputeTokensOnHit != 50 {
		t.Fatalf("depth-0 anchor: %+v %v stats %+v", m, ok, x.stats)
	}
}

// TestSnapshotLookupBounds: matched beyond the prompt or negative never panics; anchors deeper
// than the prompt cannot be hashed and never match.
func TestSnapshotLookupBounds(t *testing.T) {
	x := newSnapshotIndex(Options{})
	short := snapToks[:20]
	x.insert(snapKey(16), 1, 0, 16)
	x.insert(snapKey(32), 2, 0, 32)
	if m, ok := x.lookupTiered(short, 1000, 0, 0); !ok || m.slot != 1 {
		t.Fatalf("matched past the prompt: %+v %v", m, ok)
	}
	if _, ok := x.lookupTiered(short, -5, 0, 0); ok {
		t.Fatal("negative matched hit")
	}
	if x.stats.RecomputeTokensOnMiss != 0 || x.stats.RecomputeTokensOnHit != 1000-16 {
		t.Fatalf("stats %+v", x.stats)
	}
}

func TestSnapshotEvictSlot(t *testing.T) {
	x := newSnapshotIndex(Options{})
	snapFix(x, 4, 1, 10, 1, snapTail)
	snapFix(x, 5, 2, 10, 2, snapPlain)
	x.lastLookupSession = 1
	x.evictToTier(0) // spills 5: 4 is leased
	if x.evictSlot(5) {
		t.Fatal("a spilled entry's stale slot matched")
	}
	if x.evictSlot(-1) || x.evictSlot(99) {
		t.Fatal("unknown slot matched")
	}
	if !x.evictSlot(4) { // the lease is not consulted
		t.Fatal("evictSlot(4) failed")
	}
	if x.count() != 1 || x.stats.Evictions != 1 || x.evictionsSinceLookup != 2 {
		t.Fatalf("count %d stats %+v since %d", x.count(), x.stats, x.evictionsSinceLookup)
	}
}

// snapshot_insert_tier.rs: no double free of spilled slots.
func TestSnapshotInsertOverSpilled(t *testing.T) {
	spilled := func(kind snapKind, slot int) *snapshotIndex {
		x := newSnapshotIndex(Options{})
		snapFix(x, slot, 1, 10, 1, kind)
		if te, ok := x.evictToTier(0); !ok || !te.Spill {
			t.Fatal("setup spill failed")
		}
		return x
	}
	x := spilled(snapPlain, 11) // 1
	d, ok := x.insert(11, 12, 1, 10)
	wantNone(t, "plain over spilled", d, ok)

	x = spilled(snapPlain, 11) // 2, 3
	if got := x.insertTail(11, 13, 1, 10); len(got) != 0 {
		t.Fatalf("tail over spilled displaced %v", got)
	}
	if e, _ := snapEntryFor(x, 11); e.tiered || !e.isTail {
		t.Fatalf("tail over spilled: %+v", e)
	}
	s, ok := x.evictLRU()
	wantSlot(t, "evictLRU", s, ok, 13)

	x = spilled(snapPlain, 11) // 4
	d, ok = x.insertTailSibling(11, 14, 1, 10)
	wantNone(t, "sibling over spilled", d, ok)
	s, ok = x.evictLRU()
	wantSlot(t, "evictLRU", s, ok, 14)

	x = spilled(snapTail, 41) // 5
	if got := x.insertTail(77, 42, 1, 10); len(got) != 0 || x.count() != 1 {
		t.Fatalf("sweep handed back a spilled tail: %v (count %d)", got, x.count())
	}

	x = newSnapshotIndex(Options{}) // 6
	x.insert(21, 21, 1, 10)
	d, ok = x.insert(21, 22, 1, 10)
	wantSlot(t, "plain over resident", d, ok, 21)

	x = newSnapshotIndex(Options{}) // 7
	x.insertTail(31, 31, 1, 10)
	if got := x.insertTail(32, 32, 1, 10); !slices.Equal(got, []int{31}) {
		t.Fatalf("superseding a tail displaced %v", got)
	}
}

// snapshot_reap.rs cases 3–6.
func TestSnapshotForgetTiered(t *testing.T) {
	x := newSnapshotIndex(Options{})
	ph := snapKey(64)
	x.insert(ph, 99, 7, 64)
	x.evictToTier(0)
	since := x.evictionsSinceLookup
	if x.forgetTiered(12345) {
		t.Fatal("unknown key forgotten")
	}
	if !x.forgetTiered(ph) || x.count() != 0 {
		t.Fatal("forget of a spilled entry failed")
	}
	if x.forgetTiered(ph) {
		t.Fatal("second forget succeeded")
	}
	if _, ok := x.lookupTiered(snapToks, 64, 7, 0); ok {
		t.Fatal("forgotten entry still found")
	}
	if x.stats.TierReaps != 1 || x.stats.Evictions != 0 || since != 1 {
		t.Fatalf("stats %+v since %d", x.stats, since)
	}
	x.insert(ph, 99, 7, 64)
	x.evictToTier(0)
	x.promote(ph, 123)
	before := x.evictionsSinceLookup
	if x.forgetTiered(ph) || x.count() != 1 || x.evictionsSinceLookup != before {
		t.Fatal("forget of a resident (promoted) entry must refuse")
	}
	if m, ok := x.lookupTiered(snapToks, 64, 7, 0); !ok || m.tiered || m.slot != 123 {
		t.Fatalf("lookup after refused forget: %+v", m)
	}
}

// CONTRACT.md, "Decisions", that differ from the reference, and invalid input.
func TestSnapshotDecisions(t *testing.T) {
	x := newSnapshotIndex(Options{})
	x.insert(1, 5, 0, 10)
	d, ok := x.insert(1, 5, 0, 10)
	wantNone(t, "same slot again (plain)", d, ok)
	d, ok = x.insertTailSibling(1, 5, 0, 10)
	wantNone(t, "same slot again (sibling)", d, ok)
	x.insertTail(2, 6, 3, 10)
	if got := x.insertTail(2, 6, 3, 10); len(got) != 0 {
		t.Fatalf("same tail again displaced %v", got)
	}
	if x.promote(1, 9) {
		t.Fatal("promote on a resident entry succeeded")
	}
	if e, _ := snapEntryFor(x, 1); e.slot != 5 || x.stats.TierFaultIns != 0 {
		t.Fatalf("promote on resident changed %+v", e)
	}
	before := slices.Clone(x.entries)
	if d, ok := x.insert(7, -1, 0, 10); ok || d != 0 {
		t.Fatal("negative slot accepted")
	}
	if got := x.insertTail(8, -2, 3, 10); got != nil {
		t.Fatal("negative tail slot accepted")
	}
	if _, ok := x.insertTailSibling(9, 1, 0, -3); ok || x.evictSlot(-1) {
		t.Fatal("invalid input accepted")
	}
	x.evictToTier(0)
	if x.promote(x.entries[0].key, -1) {
		t.Fatal("promote to a negative slot accepted")
	}
	if len(x.entries) != len(before) {
		t.Fatal("invalid input changed the index")
	}
}

func TestSnapshotOptionsClamp(t *testing.T) {
	nan := 0.0
	nan /= nan
	for _, c := range []struct{ in, want float64 }{{-1, 0}, {nan, 0}, {3, 3}, {100, 8}} {
		if got := newSnapshotIndex(Options{SnapshotEvictAlpha: c.in}).alpha; got != c.want {
			t.Errorf("alpha %v → %v, want %v", c.in, got, c.want)
		}
	}
	if newSnapshotIndex(Options{}).leaseTTL != DefaultTailLeaseTTL || newSnapshotIndex(Options{TailLeaseTTL: 3}).leaseTTL != 3 {
		t.Error("TTL default")
	}
}

// TestSnapshotLegacyEviction: the legacy path: per-entry LRU over resident entries, lease
// ignored, evictionsSinceLookup not advanced (parity).
func TestSnapshotLegacyEviction(t *testing.T) {
	x := newSnapshotIndex(Options{LegacySnapshotEviction: true})
	snapFix(x, 1, 1, 10, 5, snapTail) // oldest, leased under the session-aware path
	snapFix(x, 2, 2, 10, 9, snapPlain)
	snapFix(x, 3, 2, 10, 9, snapPlain) // ties with 2: the first in list order wins
	x.lastLookupSession = 1
	// Removing 1 swap-moves 3 into the front, so 3 precedes 2 in list order (as in the reference).
	for _, want := range []int{1, 3, 2} {
		s, ok := x.evictLRU()
		wantSlot(t, "legacy evictLRU", s, ok, want)
	}
	if x.evictionsSinceLookup != 0 || x.stats.Evictions != 3 {
		t.Fatalf("since %d evictions %d", x.evictionsSinceLookup, x.stats.Evictions)
	}
	snapFix(x, 4, 0, 10, 1, snapPlain)
	x.evictToTier(0) // the tier path is always session-aware and counts
	s, ok := x.evictLRU()
	wantNone(t, "legacy evictLRU with only spilled entries", s, ok)
	if x.evictionsSinceLookup != 1 {
		t.Fatalf("since %d", x.evictionsSinceLookup)
	}
}
