package local

import "math"

// Victim choice for the snapshot index and the tail lease (CONTRACT.md,
// "Victim choice and the tail lease").
//
// Why sessions first: the entries of one conversation are restored together, turn after turn, so
// the stalest conversation is the cheapest to lose. Why pure recency inside a session (α = 0):
// the old score last_access × (1 + hits) let any once-hit old entry outlive every fresh save, so
// each save evicted the previous one, the live turn's tail, and the anchor froze. Why a lease on the tail and sibling rather than on the deepest entry: the deepest entry is
// the end-of-turn finish leaf, above the next turn's block-floored match, so it never restores;
// the tail does. The lease lapses after leaseTTL evictions without a lookup
// from its session, so a dead session cannot hold slots forever, and it never stops progress: a
// leased entry is skipped only while an unleased eligible one exists.

// tailLeaseActiveLocked reports whether the last-seen session's tail and sibling are protected.
func (x *snapshotIndex) tailLeaseActiveLocked() bool {
	return x.lastLookupSession != 0 && !x.leaseOff && x.evictionsSinceLookup < x.leaseTTL
}

// leasedLocked reports whether e is protected by the live session's lease.
func (x *snapshotIndex) leasedLocked(e *snapEntry, tailProtect bool) bool {
	return tailProtect && (e.isTail || e.isTailSibling) && e.session != 0 && e.session == x.lastLookupSession
}

// victimLocked returns the index of the entry to evict, or -1 when no entry is eligible
// (skipSpilled and every entry spilled). Score is norm(lastAccess) + α·norm(depth), each min-max
// normalised over every eligible entry (leased ones included); the victim is the entry of the
// stalest session (the greatest eligible lastAccess of its session is the smallest) with the
// smallest score, compared as the pair (freshness, score); a full tie keeps list order.
//
// Cost: two passes and one map operation per eligible entry. The second pass needs no map when a
// single session is the stalest, which is the rule (freshness values are distinct clock stamps).
func (x *snapshotIndex) victimLocked(tailProtect, skipSpilled bool) int {
	clear(x.sessIdx)
	x.sess = x.sess[:0]
	var laMin, laMax uint64 = math.MaxUint64, 0
	dMin, dMax := math.MaxInt, math.MinInt
	nEligible, nUnleased := 0, 0
	for i := range x.entries {
		e := &x.entries[i]
		if skipSpilled && e.tiered {
			continue
		}
		nEligible++
		laMin, laMax = min(laMin, e.lastAccess), max(laMax, e.lastAccess)
		dMin, dMax = min(dMin, e.tokenCount), max(dMax, e.tokenCount)
		j, ok := x.sessIdx[e.session]
		if !ok {
			j = len(x.sess)
			x.sessIdx[e.session] = j
			x.sess = append(x.sess, victimSession{session: e.session})
		}
		s := &x.sess[j]
		s.fresh = max(s.fresh, e.lastAccess)
		if !x.leasedLocked(e, tailProtect) {
			nUnleased++
			s.unleased = true
		}
	}
	if nEligible == 0 {
		return -1
	}
	skipLeased := nUnleased >= 1
	// The stalest session among those that still have a candidate after the lease filter.
	stalest, nStalest := uint64(0), 0
	var target uint64
	for _, s := range x.sess {
		if skipLeased && !s.unleased {
			continue
		}
		switch {
		case nStalest == 0 || s.fresh < stalest:
			stalest, nStalest, target = s.fresh, 1, s.session
		case s.fresh == stalest:
			nStalest++
		}
	}
	best, bestScore := -1, 0.0
	for i := range x.entries {
		e := &x.entries[i]
		if skipSpilled && e.tiered {
			continue
		}
		if nStalest == 1 {
			if e.session != target {
				continue
			}
		} else if x.sess[x.sessIdx[e.session]].fresh != stalest {
			continue
		}
		if skipLeased && x.leasedLocked(e, tailProtect) {
			continue
		}
		s := normU64(e.lastAccess, laMin, laMax) + x.alpha*normInt(e.tokenCount, dMin, dMax)
		if best < 0 || s < bestScore {
			best, bestScore = i, s
		}
	}
	return best
}

// victimSession is victimLocked's per-session scratch.
type victimSession struct {
	session  uint64
	fresh    uint64 // greatest lastAccess among the session's eligible entries
	unleased bool   // the session has an eligible entry the lease does not protect
}

// legacyVictimLocked is the legacy per-entry LRU (Options.LegacySnapshotEviction): the resident entry with the
// smallest lastAccess, the first in list order on a tie; -1 when every entry is spilled.
func (x *snapshotIndex) legacyVictimLocked() int {
	best := -1
	for i := range x.entries {
		e := &x.entries[i]
		if e.tiered {
			continue
		}
		if best < 0 || e.lastAccess < x.entries[best].lastAccess {
			best = i
		}
	}
	return best
}

// normU64 maps v in [lo, hi] to [0, 1]; a degenerate range maps to 0.
func normU64(v, lo, hi uint64) float64 {
	if hi <= lo {
		return 0
	}
	return float64(v-lo) / float64(hi-lo)
}

// normInt maps v in [lo, hi] to [0, 1]; a degenerate range maps to 0.
func normInt(v, lo, hi int) float64 {
	if hi <= lo {
		return 0
	}
	return float64(v-lo) / float64(hi-lo)
}
