package local

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// Model-based test of the snapshot index (a model-based test): random operation sequences run against
// the index and against refIndex (snapshot_ref_test.go), a naive restatement of CONTRACT.md, "The snapshot index" (a plain
// list, linear scans, every key hashed from scratch), with invariants 13–19 of CONTRACT.md checked
// after every step. The index must agree with the reference on every result and on its whole
// state (entries in list order, clock, latch, lease counter, stats).
//
// Fuzzing: go test -run XXX -fuzz FuzzSnapshotOps -fuzzminimizetime 1s ./local/ (the default
// minimisation budget of 60 s per new input stalls the run on this target).

// snapPicker supplies the random choices: a PRNG in the model test, fuzz bytes in the fuzz target.
type snapPicker interface{ pick(n int) int }

type randPicker struct{ r *rand.Rand }

func (p randPicker) pick(n int) int { return p.r.IntN(n) }

// bytePicker reads one byte per choice and reports exhaustion, which ends the run.
type bytePicker struct {
	b    []byte
	done bool
}

func (p *bytePicker) pick(n int) int {
	if len(p.b) == 0 {
		p.done = true
		return 0
	}
	v := int(p.b[0]) % n
	p.b = p.b[1:]
	return v
}

// snapModel drives the index and the reference side by side and keeps the slot ledger.
type snapModel struct {
	t        testing.TB
	x        *snapshotIndex
	r        *refIndex
	prompts  [][]uint32
	live     map[int]bool // ledger: slots the index holds resident (invariant 14)
	freed    []int        // slots handed back, available for reuse
	next     int          // next never-used slot
	sibOK    map[uint64]bool
	pushes   uint64 // plain and sibling pushes (invariant 19)
	prev     SnapshotStats
	seen     map[string]int    // outcomes reached, so the test can show it exercised them
	slots    []int             // check scratch: resident slots
	kinds    map[[2]uint64]int // check scratch: (session, tail 0 / sibling 1) → entries
	sessions []uint64
	adapters []uint64
	depths   []int
}

func newSnapModel(t testing.TB, o Options) *snapModel {
	m := &snapModel{t: t, x: newSnapshotIndex(o), r: newRefIndex(o), live: map[int]bool{}, sibOK: map[uint64]bool{}, seen: map[string]int{}, kinds: map[[2]uint64]int{},
		sessions: []uint64{0, 1, 2, 3, 0xdead}, adapters: []uint64{0, 7, 9},
		depths: []int{0, 5, 16, 24, 32, 40, 48, 63, 64, 80, 96, 100, 112, 128}}
	shared := snapSeq(5000, 5032)
	for i := range 6 { // prompts share a 32-token system prefix, then diverge
		p := append(slices.Clone(shared), snapSeq(uint32(100*i), uint32(100*i+96))...)
		m.prompts = append(m.prompts, p)
	}
	return m
}

func (m *snapModel) newSlot(p snapPicker) int {
	if len(m.freed) > 0 && p.pick(3) == 0 {
		i := p.pick(len(m.freed))
		s := m.freed[i]
		m.freed = slices.Delete(m.freed, i, i+1)
		return s
	}
	m.next++
	return m.next
}

// give records a slot the index handed back: it must have been live (invariant 14).
func (m *snapModel) give(op string, slot int) {
	if !m.live[slot] {
		m.t.Fatalf("%s returned slot %d, which the index does not hold (double free or stale spilled slot)", op, slot)
	}
	delete(m.live, slot)
	m.freed = append(m.freed, slot)
	m.seen[op+" returned a slot"]++
}

func (m *snapModel) step(p snapPicker) string {
	prompt := m.prompts[p.pick(len(m.prompts))]
	adapter := m.adapters[p.pick(len(m.adapters))]
	session := m.sessions[p.pick(len(m.sessions))]
	depth := m.depths[p.pick(len(m.depths))]
	key := prefixHash(prompt, depth, adapter)
	switch op := p.pick(20); {
	case op < 5, op == 19: // lookups; matched up to the prompt and a little past it
		matched := p.pick(len(prompt)+8) - 2
		resident := op == 19
		before := slices.Clone(m.x.entries)
		var gotIdx int
		gotOK := false
		if resident {
			_, _, gotOK = m.x.lookupResident(prompt, matched, session, adapter)
		} else {
			_, gotOK = m.x.lookupTiered(prompt, matched, session, adapter)
		}
		want := m.r.lookup(prompt, matched, session, adapter, resident)
		if gotOK != (want >= 0) {
			m.t.Fatalf("lookup(matched %d, session %d): hit %v, reference %d", matched, session, gotOK, want)
		}
		gotIdx = -1
		for i := range before { // invariant 17: only the winner's recency moves
			if before[i] != m.x.entries[i] {
				if gotIdx >= 0 || before[i].lastAccess == m.x.entries[i].lastAccess {
					m.t.Fatalf("lookup changed more than the winner's recency")
				}
				gotIdx = i
			}
		}
		if gotIdx != want {
			m.t.Fatalf("lookup winner %d, reference %d", gotIdx, want)
		}
		if want >= 0 {
			depth := m.r.entries[want].tokenCount
			if depth > matched || m.x.stats.RecomputeTokensOnHit-m.prev.RecomputeTokensOnHit != uint64(matched-depth) {
				m.t.Fatalf("anchor at %d for matched %d, recompute delta %d", depth, matched,
					m.x.stats.RecomputeTokensOnHit-m.prev.RecomputeTokensOnHit)
			}
		}
		return fmt.Sprintf("lookup(%d,%d,%d)", matched, session, adapter)
	case op < 8: // plain insert; sometimes the same slot again for the same key
		slot := m.slotFor(p, key)
		if m.r.find(key) < 0 {
			m.pushes++
		}
		d, ok := m.x.insert(key, slot, session, depth)
		rd, rok := m.r.upsert(key, slot, session, depth, snapPlain)
		m.checkInsert("insert", key, slot, d, ok, rd, rok, snapPlain)
		return "insert"
	case op < 10:
		slot := m.slotFor(p, key)
		got := m.x.insertTail(key, slot, session, depth)
		want := m.r.insertTail(key, slot, session, depth)
		if !slices.Equal(got, want) {
			m.t.Fatalf("insertTail displaced %v, reference %v", got, want)
		}
		if session != 0 {
			delete(m.live, slot) // re-added below; the slot may be a re-registration
		}
		for _, s := range got {
			m.give("insertTail", s)
		}
		m.live[slot] = true
		m.sibOK[session] = true
		m.checkKind(key, snapTail)
		return "insertTail"
	case op < 11: // a sibling follows its session's tail
		if !m.sibOK[session] && session != 0 {
			return "skip"
		}
		m.sibOK[session] = false
		slot := m.slotFor(p, key)
		if m.r.find(key) < 0 {
			m.pushes++
		}
		d, ok := m.x.insertTailSibling(key, slot, session, depth)
		rd, rok := m.r.upsert(key, slot, session, depth, snapSibling)
		m.checkInsert("insertTailSibling", key, slot, d, ok, rd, rok, snapSibling)
		return "insertTailSibling"
	case op < 14:
		eligible := m.residentCount() > 0
		s, ok := m.x.evictLRU()
		rs, rok := m.r.evictLRU()
		if s != rs || ok != rok || ok != eligible { // invariant 18
			m.t.Fatalf("evictLRU (%d,%v), reference (%d,%v), eligible %v", s, ok, rs, rok, eligible)
		}
		if ok {
			m.give("evictLRU", s)
		}
		return "evictLRU"
	case op < 15:
		slot := m.next + 1
		if len(m.live) > 0 && p.pick(4) != 0 {
			slot = m.anyLive(p)
		} else if len(m.freed) > 0 && p.pick(2) == 0 {
			slot = m.freed[p.pick(len(m.freed))]
		}
		ok, rok := m.x.evictSlot(slot), m.r.evictSlot(slot)
		if ok != rok {
			m.t.Fatalf("evictSlot(%d) %v, reference %v", slot, ok, rok)
		}
		if ok {
			m.give("evictSlot", slot)
		}
		return "evictSlot"
	case op < 17:
		minTokens := []int{0, 16, 40, 100}[p.pick(4)]
		eligible := m.residentCount() > 0
		te, ok := m.x.evictToTier(minTokens)
		rte, rok := m.r.evictToTier(minTokens)
		if te != rte || ok != rok || ok != eligible {
			m.t.Fatalf("evictToTier %+v %v, reference %+v %v", te, ok, rte, rok)
		}
		if ok {
			m.give("evictToTier", te.Slot)
			if !te.Spill {
				m.seen["drop"]++
			}
		}
		return "evictToTier"
	case op < 18:
		k := key
		if i := m.pickEntry(p); i >= 0 {
			k = m.r.entries[i].key
		}
		slot := m.newSlot(p)
		ok := m.x.promote(k, slot)
		ri := m.r.find(k)
		rok := ri >= 0 && m.r.entries[ri].tiered
		if rok {
			m.r.entries[ri].tiered, m.r.entries[ri].slot = false, slot
			m.r.stats.TierFaultIns++
		}
		if ok != rok {
			m.t.Fatalf("promote %v, reference %v", ok, rok)
		}
		if ok {
			m.live[slot] = true
			m.seen["promote ok"]++
		} else {
			m.freed = append(m.freed, slot) // never registered: the caller frees it
		}
		return "promote"
	default:
		k := key
		if i := m.pickEntry(p); i >= 0 {
			k = m.r.entries[i].key
		}
		ok := m.x.forgetTiered(k)
		ri := m.r.find(k)
		rok := ri >= 0 && m.r.entries[ri].tiered
		if rok {
			m.r.remove(ri)
			m.r.stats.TierReaps++
		}
		if ok != rok {
			m.t.Fatalf("forget %v, reference %v", ok, rok)
		}
		if ok {
			m.seen["forget ok"]++
		}
		return "forget"
	}
}

func (m *snapModel) slotFor(p snapPicker, key uint64) int {
	if i := m.r.find(key); i >= 0 {
		if m.r.entries[i].tiered {
			m.seen["insert over spilled"]++
		} else if p.pick(4) == 0 {
			m.seen["same slot again"]++
			return m.r.entries[i].slot // re-register the same slot for the same key
		}
	}
	return m.newSlot(p)
}

func (m *snapModel) anyLive(p snapPicker) int {
	keys := make([]int, 0, len(m.live))
	for s := range m.live {
		keys = append(keys, s)
	}
	slices.Sort(keys)
	return keys[p.pick(len(keys))]
}

func (m *snapModel) pickEntry(p snapPicker) int {
	if len(m.r.entries) == 0 || p.pick(4) == 0 {
		return -1
	}
	return p.pick(len(m.r.entries))
}

func (m *snapModel) residentCount() int {
	n := 0
	for _, e := range m.r.entries {
		if !e.tiered {
			n++
		}
	}
	return n
}

func (m *snapModel) checkInsert(op string, key uint64, slot, d int, ok bool, rd int, rok bool, kind snapKind) {
	if d != rd || ok != rok {
		m.t.Fatalf("%s displaced (%d,%v), reference (%d,%v)", op, d, ok, rd, rok)
	}
	if ok {
		if d == slot {
			m.t.Fatalf("%s handed back the slot being registered", op)
		}
		m.give(op, d)
	}
	m.live[slot] = true
	m.checkKind(key, kind)
}

// checkKind is invariant 15.
func (m *snapModel) checkKind(key uint64, kind snapKind) {
	e, ok := snapEntryFor(m.x, key)
	if !ok || e.tiered || e.isTail != (kind == snapTail) || e.isTailSibling != (kind == snapSibling) {
		m.t.Fatalf("after a kind-%d insert the entry is %+v (present %v)", kind, e, ok)
	}
}

// check compares the whole state with the reference and checks invariants 13, 14, 16 and 19.
func (m *snapModel) check(op string) {
	x, r := m.x, m.r
	if !slices.Equal(x.entries, r.entries) || x.clock != r.clock || x.lastLookupSession != r.latch ||
		x.evictionsSinceLookup != r.since || x.stats != r.stats {
		m.t.Fatalf("after %s the index diverged from the reference:\n got %+v\nwant %+v\n stats %+v / %+v",
			op, x.entries, r.entries, x.stats, r.stats)
	}
	checkSnapshotStructure(m.t, x)
	if c := x.count(); c != len(r.entries) {
		m.t.Fatalf("count %d, reference holds %d entries", c, len(r.entries))
	}
	m.slots = m.slots[:0]
	clear(m.kinds)
	for _, e := range x.entries {
		if !e.tiered {
			m.slots = append(m.slots, e.slot)
		}
		if e.session != 0 && (e.isTail || e.isTailSibling) {
			k := [2]uint64{e.session, 0}
			if e.isTailSibling {
				k[1] = 1
			}
			if m.kinds[k]++; m.kinds[k] > 1 {
				m.t.Fatalf("session %d has two entries of kind %d (tail 0, sibling 1)", k[0], k[1])
			}
		}
	}
	slices.Sort(m.slots)
	if len(slices.Compact(m.slots)) != len(m.slots) {
		m.t.Fatalf("a slot is resident twice: %v", m.slots)
	}
	if len(m.slots) != len(m.live) {
		m.t.Fatalf("ledger holds %d slots, index %d resident", len(m.live), len(m.slots))
	}
	for _, s := range m.slots {
		if !m.live[s] {
			m.t.Fatalf("resident slot %d is not in the ledger", s)
		}
	}
	st, pv := x.stats, m.prev
	if st.Hits > st.Lookups || st.TierHits > st.Hits || st.Saves < pv.Saves || st.Lookups < pv.Lookups ||
		st.Hits < pv.Hits || st.AnchorDepthSum < pv.AnchorDepthSum || st.RecomputeTokensOnHit < pv.RecomputeTokensOnHit ||
		st.RecomputeTokensOnMiss < pv.RecomputeTokensOnMiss || st.Evictions < pv.Evictions || st.TierSpills < pv.TierSpills ||
		st.TierHits < pv.TierHits || st.TierFaultIns < pv.TierFaultIns || st.TierReaps < pv.TierReaps {
		m.t.Fatalf("stats identities broken: %+v after %+v", st, pv)
	}
	if st.Saves != m.pushes {
		m.t.Fatalf("saves %d, plain and sibling pushes %d", st.Saves, m.pushes)
	}
	m.prev = st
}

// checkSnapshotStructure checks the index's secondary structures against its entry list
// (invariant 13: one entry per key; byDepth one triple per entry, sorted, pointing home).
func checkSnapshotStructure(t testing.TB, x *snapshotIndex) {
	if len(x.byKey) != len(x.entries) || len(x.byDepth) != len(x.entries) {
		t.Fatalf("structure sizes: entries %d byKey %d byDepth %d", len(x.entries), len(x.byKey), len(x.byDepth))
	}
	for i, e := range x.entries {
		if x.byKey[e.key] != i {
			t.Fatalf("byKey[%#x] = %d, want %d", e.key, x.byKey[e.key], i)
		}
	}
	for j, dk := range x.byDepth {
		if j > 0 && cmpDepthKey(x.byDepth[j-1], dk.depth, dk.key) >= 0 {
			t.Fatal("byDepth not strictly sorted")
		}
		if e := x.entries[dk.idx]; e.key != dk.key || e.tokenCount != dk.depth {
			t.Fatalf("byDepth[%d] = %+v points at %+v", j, dk, e)
		}
	}
}

var snapModelConfigs = []struct {
	name string
	opts Options
}{
	{"default", Options{}},
	{"hermetic", Options{Hermetic: true}},
	{"lease-off", Options{DisableTailLease: true}},
	{"legacy", Options{LegacySnapshotEviction: true}},
	{"alpha2-ttl3", Options{SnapshotEvictAlpha: 2, TailLeaseTTL: 3}},
}

// TestSnapshotModel runs 100,000 random operations on the default configuration and 30,000 on
// each other one (a fifth of that with -short), checking every step.
func TestSnapshotModel(t *testing.T) {
	for ci, c := range snapModelConfigs {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			steps := 30_000
			if ci == 0 {
				steps = 100_000
			}
			if testing.Short() {
				steps /= 5
			}
			m := newSnapModel(t, c.opts)
			p := randPicker{rand.New(rand.NewPCG(uint64(ci)+1, 0x5eed))}
			for range steps {
				m.check(m.step(p))
			}
			for _, k := range []string{"promote ok", "forget ok", "drop", "insert over spilled", "same slot again",
				"insert returned a slot", "insertTail returned a slot", "insertTailSibling returned a slot",
				"evictLRU returned a slot", "evictSlot returned a slot", "evictToTier returned a slot"} {
				if m.seen[k] == 0 {
					t.Errorf("the generator never reached %q", k)
				}
			}
			st := m.x.stats
			if st.Hits == 0 || st.TierHits == 0 || st.Hits == st.Lookups {
				t.Errorf("lookups do not exercise hits, tier hits and misses: %+v", st)
			}
			if lease := !c.opts.DisableTailLease; lease != (m.r.leaseSkips > 0) {
				t.Errorf("lease protected %d entries (lease on: %v)", m.r.leaseSkips, lease)
			}
			t.Logf("%+v lease skips %d", m.seen, m.r.leaseSkips)
		})
	}
}

// maxSnapFuzzBytes bounds a fuzz input to a few hundred operations (about six bytes each):
// longer inputs find nothing new but make the fuzzer's minimisation crawl.
const maxSnapFuzzBytes = 2048

// FuzzSnapshotOps decodes operation sequences from fuzz bytes (first byte: the configuration) and
// checks that nothing panics and the index agrees with the reference and its invariants. The
// seeds run in the normal suite.
func FuzzSnapshotOps(f *testing.F) {
	f.Add([]byte{0})
	f.Add([]byte("\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f\x10\x11\x12\x13"))
	for ci := range snapModelConfigs {
		r := rand.New(rand.NewPCG(uint64(ci), 7))
		b := []byte{byte(ci)}
		for range maxSnapFuzzBytes - 1 {
			b = append(b, byte(r.UintN(256)))
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 || len(data) > maxSnapFuzzBytes {
			return
		}
		m := newSnapModel(t, snapModelConfigs[int(data[0])%len(snapModelConfigs)].opts)
		p := &bytePicker{b: data[1:]}
		for !p.done {
			op := m.step(p)
			m.check(op)
		}
	})
}
