package kvevents

import "github.com/prefixmesh/prefixmesh/local"

// The mirror's summary journal is a local.Journal, the tree's own ring, changed under m.mu with
// the mirror; the gossip publisher reads it exactly as it reads a local.RadixTree's.

// SummarySince appends every change after since; ok is false when since has left the ring or is
// ahead of head (take a SummarySnapshot then).
func (m *CacheMirror) SummarySince(since uint64, dst []local.SummaryEvent) ([]local.SummaryEvent, uint64, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.journal.Since(since, dst)
}

// SummarySnapshot appends the canonical hash of every visible block and returns the sequence
// number it corresponds to.
func (m *CacheMirror) SummarySnapshot(dst []uint64) ([]uint64, uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for h := range m.canon {
		dst = append(dst, h)
	}
	return dst, m.journal.Head()
}

// SummaryHead is the sequence number of the newest change.
func (m *CacheMirror) SummaryHead() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.journal.Head()
}
