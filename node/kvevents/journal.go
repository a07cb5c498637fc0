package kvevents

import "github.com/prefixmesh/prefixmesh/local"

// journal is the mirror's summary journal: a bounded ring of the newest visibility changes with
// one sequence number each, read by the gossip publisher (SummarySince) exactly as it reads a
// local.RadixTree's (local/journal.go has the same contract; the ring is restated here because
// local keeps its own unexported).
type journal struct {
	ring []journalEntry
	cap  int
	head uint64 // sequence number of the newest event; 0 before the first
}

type journalEntry struct {
	hash  uint64
	added bool
}

func (j *journal) init(capacity int) { j.cap = capacity }

func (j *journal) emit(h uint64, added bool) {
	j.head++
	e := journalEntry{hash: h, added: added}
	if len(j.ring) < j.cap {
		j.ring = append(j.ring, e)
		return
	}
	j.ring[(j.head-1)%uint64(j.cap)] = e
}

// SummarySince appends every change after since; ok is false when since has left the ring or is
// ahead of head (take a SummarySnapshot then).
func (m *Mirror) SummarySince(since uint64, dst []local.SummaryEvent) ([]local.SummaryEvent, uint64, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	j := &m.journal
	if since > j.head || j.head-since > uint64(len(j.ring)) {
		return dst, j.head, false
	}
	for s := since + 1; s <= j.head; s++ {
		e := j.ring[(s-1)%uint64(j.cap)]
		dst = append(dst, local.SummaryEvent{Seq: s, Hash: e.hash, Added: e.added})
	}
	return dst, j.head, true
}

// SummarySnapshot appends the canonical hash of every visible block and returns the sequence
// number it corresponds to.
func (m *Mirror) SummarySnapshot(dst []uint64) ([]uint64, uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for h := range m.canon {
		dst = append(dst, h)
	}
	return dst, m.journal.head
}

// SummaryHead is the sequence number of the newest change.
func (m *Mirror) SummaryHead() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.journal.head
}
