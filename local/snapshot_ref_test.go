package local

// refIndex is the model-based test's reference for the snapshot index (snapshot_model_test.go)
// and BenchmarkLookupTiered's baseline.

// refIndex is the naive reference. It shares only data types and the gate predicate (which has
// its own truth-table test) with the code under test.
type refIndex struct {
	hermetic, leaseOff, legacy bool
	ttl                        uint32
	alpha                      float64
	entries                    []snapEntry
	clock, latch               uint64
	since                      uint32
	stats                      SnapshotStats
	leaseSkips                 int // victim choices in which the lease protected an entry
}

func newRefIndex(o Options) *refIndex {
	x := newSnapshotIndex(o) // the clamping rules are tested on their own
	return &refIndex{hermetic: o.Hermetic, leaseOff: o.DisableTailLease, legacy: o.LegacySnapshotEviction, ttl: x.leaseTTL, alpha: x.alpha}
}

func (r *refIndex) find(key uint64) int {
	for i := range r.entries {
		if r.entries[i].key == key {
			return i
		}
	}
	return -1
}

func (r *refIndex) remove(i int) {
	r.entries[i] = r.entries[len(r.entries)-1]
	r.entries = r.entries[:len(r.entries)-1]
}

func (r *refIndex) lookup(tokens []uint32, matched int, session, adapter uint64, residentOnly bool) int {
	if session != 0 {
		r.latch, r.since = session, 0
	}
	best := -1
	for i := range r.entries {
		e := &r.entries[i]
		if e.tokenCount > matched || e.tokenCount > len(tokens) || (residentOnly && e.tiered) ||
			sessionGateBlocks(e, session, r.hermetic) || prefixHash(tokens, e.tokenCount, adapter) != e.key {
			continue
		}
		if best < 0 || e.tokenCount > r.entries[best].tokenCount {
			best = i
		}
	}
	r.stats.Lookups++
	m := uint64(max(matched, 0))
	if best < 0 {
		r.stats.RecomputeTokensOnMiss += m
		return -1
	}
	r.clock++
	e := &r.entries[best]
	e.lastAccess = r.clock
	r.stats.Hits++
	r.stats.AnchorDepthSum += uint64(e.tokenCount)
	r.stats.RecomputeTokensOnHit += m - uint64(e.tokenCount)
	if e.tiered {
		r.stats.TierHits++
	}
	return best
}

func (r *refIndex) upsert(key uint64, slot int, session uint64, depth int, kind snapKind) (int, bool) {
	if i := r.find(key); i >= 0 {
		e := &r.entries[i]
		old, wasResident := e.slot, !e.tiered
		r.clock++
		*e = snapEntry{slot: slot, session: session, tokenCount: depth, key: key, lastAccess: r.clock,
			isTail: kind == snapTail, isTailSibling: kind == snapSibling}
		if wasResident && old != slot {
			return old, true
		}
		return 0, false
	}
	r.clock++
	if kind != snapTail {
		r.stats.Saves++
	}
	r.entries = append(r.entries, snapEntry{slot: slot, session: session, tokenCount: depth, key: key,
		lastAccess: r.clock, isTail: kind == snapTail, isTailSibling: kind == snapSibling})
	return 0, false
}

func (r *refIndex) insertTail(key uint64, slot int, session uint64, depth int) []int {
	var out []int
	if session != 0 {
		for i := 0; i < len(r.entries); {
			if e := r.entries[i]; (e.isTail || e.isTailSibling) && e.session == session {
				if !e.tiered && e.slot != slot {
					out = append(out, e.slot)
				}
				r.remove(i)
				continue
			}
			i++
		}
	}
	if d, ok := r.upsert(key, slot, session, depth, snapTail); ok {
		out = append(out, d)
	}
	return out
}

func (r *refIndex) leaseActive() bool {
	return r.latch != 0 && !r.leaseOff && r.since < r.ttl
}

// victim restates CONTRACT.md, "Victim choice and the tail lease", in two stages: the stalest session with a candidate, then the
// smallest score within it (first in list order on a tie).
func (r *refIndex) victim() int {
	protect := r.leaseActive()
	leased := func(e snapEntry) bool {
		return protect && (e.isTail || e.isTailSibling) && e.session != 0 && e.session == r.latch
	}
	var elig []int
	unleased := 0
	fresh := map[uint64]uint64{}
	for i, e := range r.entries {
		if e.tiered {
			continue
		}
		elig = append(elig, i)
		fresh[e.session] = max(fresh[e.session], e.lastAccess)
		if !leased(e) {
			unleased++
		}
	}
	if len(elig) == 0 {
		return -1
	}
	norm := func(get func(snapEntry) float64, v float64) float64 {
		lo, hi := get(r.entries[elig[0]]), get(r.entries[elig[0]])
		for _, i := range elig {
			lo, hi = min(lo, get(r.entries[i])), max(hi, get(r.entries[i]))
		}
		if hi == lo {
			return 0
		}
		return (v - lo) / (hi - lo)
	}
	la := func(e snapEntry) float64 { return float64(e.lastAccess) }
	dp := func(e snapEntry) float64 { return float64(e.tokenCount) }
	var cands []int
	for _, i := range elig {
		if unleased >= 1 && leased(r.entries[i]) {
			r.leaseSkips++
			continue
		}
		cands = append(cands, i)
	}
	stalest := fresh[r.entries[cands[0]].session]
	for _, i := range cands {
		stalest = min(stalest, fresh[r.entries[i].session])
	}
	best, bestScore := -1, 0.0
	for _, i := range cands {
		e := r.entries[i]
		if fresh[e.session] != stalest {
			continue
		}
		s := norm(la, la(e)) + r.alpha*norm(dp, dp(e))
		if best < 0 || s < bestScore {
			best, bestScore = i, s
		}
	}
	return best
}

func (r *refIndex) evictLRU() (int, bool) {
	i := -1
	if r.legacy {
		for j, e := range r.entries {
			if !e.tiered && (i < 0 || e.lastAccess < r.entries[i].lastAccess) {
				i = j
			}
		}
	} else {
		i = r.victim()
	}
	if i < 0 {
		return 0, false
	}
	slot := r.entries[i].slot
	r.remove(i)
	r.stats.Evictions++
	if !r.legacy {
		r.since++
	}
	return slot, true
}

func (r *refIndex) evictSlot(slot int) bool {
	for i, e := range r.entries {
		if !e.tiered && e.slot == slot && slot >= 0 {
			r.remove(i)
			r.stats.Evictions++
			r.since++
			return true
		}
	}
	return false
}

func (r *refIndex) evictToTier(minTokens int) (TierEvict, bool) {
	i := r.victim()
	if i < 0 {
		return TierEvict{}, false
	}
	r.since++
	e := &r.entries[i]
	if minTokens > 0 && e.tokenCount < minTokens {
		te := TierEvict{Slot: e.slot, Depth: e.tokenCount}
		r.remove(i)
		r.stats.Evictions++
		return te, true
	}
	e.tiered = true
	r.stats.TierSpills++
	return TierEvict{Spill: true, Slot: e.slot, Key: e.key, Depth: e.tokenCount}, true
}
