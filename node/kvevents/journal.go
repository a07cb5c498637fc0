package kvevents

import "github.com/prefixmesh/prefixmesh/local"

// The tiers below TierOther are the summary's (local.Tier), value for value: the mirror
// publishes a copy on tier t under local.TierKey(hash, local.Tier(t)). These fail to compile
// if the two lists drift apart.
var (
	_ [TierOther - Tier(local.NumTiers)]struct{}
	_ [Tier(local.NumTiers) - TierOther]struct{}
	_ [TierCPU - Tier(local.TierCPU)]struct{}
	_ [Tier(local.TierCPU) - TierCPU]struct{}
	_ [TierRemote - Tier(local.TierRemote)]struct{}
	_ [Tier(local.TierRemote) - TierRemote]struct{}
)

// The mirror's summary journal is a local.Journal, the tree's own ring, changed under m.mu with
// the mirror; the gossip publisher reads it exactly as it reads a local.RadixTree's.

// SummarySince appends every change after since; ok is false when since has left the ring or is
// ahead of head (take a SummarySnapshot then).
func (m *CacheMirror) SummarySince(since uint64, dst []local.SummaryEvent) ([]local.SummaryEvent, uint64, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.journal.Since(since, dst)
}

// SummarySnapshot appends the canonical hash of every visible block and the tier key of every
// block held on a lower tier, and returns the sequence number it corresponds to.
func (m *CacheMirror) SummarySnapshot(dst []uint64) ([]uint64, uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for h := range m.canon {
		dst = append(dst, h)
	}
	for h, v := range m.lower {
		for t := TierGPU + 1; t < TierOther; t++ {
			if v[t] > 0 {
				dst = append(dst, local.TierKey(h, local.Tier(t)))
			}
		}
	}
	return dst, m.journal.Head()
}

// SummaryHead is the sequence number of the newest change.
func (m *CacheMirror) SummaryHead() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.journal.Head()
}
