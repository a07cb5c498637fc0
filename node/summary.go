package node

import (
	"fmt"

	"github.com/prefixmesh/prefixmesh/local"
	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
)

// MaxSummaryChunkHashes bounds the hashes (added and removed together) in one SummaryChunk:
// 8,192 × 9 bytes ≈ 74 KB, far below every gRPC message limit and small enough to interleave with
// other calls on the connection, while per-message overhead stays under 1%.
const MaxSummaryChunkHashes = 8192

// GetSummary implements NodeCache.GetSummary: a delta when the caller names a since_seq of this
// epoch that the tree's journal still holds, otherwise a full snapshot. Either is taken from the
// tree in one locked step, so it is exactly the set walk sees at seq (local/CONTRACT.md, "Walk").
//
// The epoch is read once, before the tree: NewEpoch is called after the old cache was dropped,
// so a summary stamped with a new epoch never holds the old epoch's blocks. A delta asked for
// across an epoch change is answered with a snapshot.
func (s *Server) GetSummary(req *pb.GetSummaryRequest, stream pb.NodeCache_GetSummaryServer) error {
	epoch := s.epoch.Load()
	if req.SinceSeq != nil && (req.GetEpoch() == 0 || req.GetEpoch() == epoch) {
		since := req.GetSinceSeq()
		events, head, ok := s.tree.SummarySince(since, nil)
		if ok {
			added, removed := netChanges(events)
			return s.sendSummary(stream, epoch, pb.SummaryKind_SUMMARY_KIND_DELTA, since, head, added, removed)
		}
	}
	hashes, seq := s.tree.SummarySnapshot(nil)
	return s.sendSummary(stream, epoch, pb.SummaryKind_SUMMARY_KIND_SNAPSHOT, 0, seq, hashes, nil)
}

// netChanges folds a run of journal events into their net effect: a hash whose last event is an
// add is in added, one whose last event is a removal is in removed. Applying both sets to the
// state at the run's start gives the state at its end, in any order. Order follows each hash's
// last event, so the result is deterministic.
func netChanges(events []local.SummaryEvent) (added, removed []uint64) {
	last := make(map[uint64]int, len(events)) // hash → index of its last event
	for i, e := range events {
		last[e.Hash] = i
	}
	for i, e := range events {
		if last[e.Hash] != i {
			continue
		}
		if e.Added {
			added = append(added, e.Hash)
		} else {
			removed = append(removed, e.Hash)
		}
	}
	return added, removed
}

// sendSummary streams added then removed in chunks of at most MaxSummaryChunkHashes, always at
// least one chunk, the final one marked last.
func (s *Server) sendSummary(stream pb.NodeCache_GetSummaryServer, epoch uint64, kind pb.SummaryKind, from, seq uint64, added, removed []uint64) error {
	for {
		c := &pb.SummaryChunk{
			NodeId:    s.nodeID,
			Epoch:     epoch,
			Seq:       seq,
			Kind:      kind,
			FromSeq:   from,
			BlockSize: s.blockSize,
		}
		room := MaxSummaryChunkHashes
		n := min(room, len(added))
		c.Hashes, added = added[:n:n], added[n:]
		room -= n
		n = min(room, len(removed))
		c.Removed, removed = removed[:n:n], removed[n:]
		c.Last = len(added) == 0 && len(removed) == 0
		if err := stream.Send(c); err != nil {
			return fmt.Errorf("send summary chunk: %w", err)
		}
		if c.Last {
			return nil
		}
	}
}
