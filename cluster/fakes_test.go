package cluster

import (
	"context"
	"sync"

	"github.com/prefixmesh/prefixmesh/local"
)

// fakeSource is a hand-written summary journal: a set plus an unbounded event log.
type fakeSource struct {
	mu     sync.Mutex // guards set and events
	set    map[uint64]bool
	events []local.SummaryEvent
	trim   uint64 // events up to this sequence have fallen out of the "ring"
}

func newFakeSource() *fakeSource { return &fakeSource{set: make(map[uint64]bool)} }

func (s *fakeSource) change(h uint64, added bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.set[h] == added {
		return
	}
	if added {
		s.set[h] = true
	} else {
		delete(s.set, h)
	}
	s.events = append(s.events, local.SummaryEvent{Seq: uint64(len(s.events)) + 1, Hash: h, Added: added})
}

func (s *fakeSource) SummarySince(since uint64, dst []local.SummaryEvent) ([]local.SummaryEvent, uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	head := uint64(len(s.events))
	if since > head || since < s.trim {
		return dst, head, false
	}
	return append(dst, s.events[since:]...), head, true
}

func (s *fakeSource) SummarySnapshot(dst []uint64) ([]uint64, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for h := range s.set {
		dst = append(dst, h)
	}
	return dst, uint64(len(s.events))
}

// snapshotFetcher serves summaries from fakeSources by node id.
type snapshotFetcher struct {
	mu      sync.Mutex // guards sources, epochs, calls
	sources map[string]*fakeSource
	epochs  map[string]uint64
	calls   int
	fail    error
}

func (f *snapshotFetcher) FetchSummary(_ context.Context, m Meta) (Summary, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.fail != nil {
		return Summary{}, f.fail
	}
	src := f.sources[m.NodeID]
	hashes, seq := src.SummarySnapshot(nil)
	return Summary{NodeID: m.NodeID, Epoch: f.epochs[m.NodeID], Seq: seq, Hashes: hashes}, nil
}
