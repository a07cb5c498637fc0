package node

import (
	"errors"
	"io"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/prefixmesh/prefixmesh/local"
	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
)

// summary is a whole GetSummary stream, reassembled and checked for consistency.
type summary struct {
	kind           pb.SummaryKind
	seq, from      uint64
	added, removed []uint64
	chunks         int
}

// getSummary reads a whole stream, checking that every chunk agrees on node, epoch, seq and kind,
// respects MaxSummaryChunkHashes, and that exactly the final chunk is marked last.
func getSummary(tb testing.TB, n *testNode, req *pb.GetSummaryRequest) summary {
	tb.Helper()
	stream, err := n.client.GetSummary(testCtx(tb), req)
	if err != nil {
		tb.Fatalf("GetSummary: %v", err)
	}
	var s summary
	lastSeen := false
	for {
		c, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			tb.Fatalf("GetSummary recv: %v", err)
		}
		if s.chunks > 0 && (c.GetSeq() != s.seq || c.GetKind() != s.kind) {
			tb.Fatalf("chunk %d: seq %d kind %v, want %d %v like the first", s.chunks, c.GetSeq(), c.GetKind(), s.seq, s.kind)
		}
		if c.GetNodeId() != "node-a" || c.GetEpoch() != n.epoch || c.GetBlockSize() != 16 {
			tb.Fatalf("chunk %d: node %q epoch %#x block size %d", s.chunks, c.GetNodeId(), c.GetEpoch(), c.GetBlockSize())
		}
		if k := len(c.GetHashes()) + len(c.GetRemoved()); k > MaxSummaryChunkHashes {
			tb.Fatalf("chunk %d holds %d hashes, over MaxSummaryChunkHashes", s.chunks, k)
		}
		if lastSeen {
			tb.Fatalf("chunk %d arrived after the last one", s.chunks)
		}
		s.kind, s.seq, s.from = c.GetKind(), c.GetSeq(), c.GetFromSeq()
		s.added = append(s.added, c.GetHashes()...)
		s.removed = append(s.removed, c.GetRemoved()...)
		s.chunks++
		lastSeen = c.GetLast()
	}
	if !lastSeen {
		tb.Fatalf("stream of %d chunks ended without a last chunk", s.chunks)
	}
	return s
}

// hashSet is the expected summary: the canonical hashes of every full block of the prompts.
func hashSet(prompts [][]uint32, bs int, adapter uint64) map[uint64]bool {
	set := map[uint64]bool{}
	for _, p := range prompts {
		for _, h := range local.BlockHashes(p, bs, adapter) {
			set[h] = true
		}
	}
	return set
}

func equalSet(tb testing.TB, what string, got []uint64, want map[uint64]bool) {
	tb.Helper()
	seen := map[uint64]bool{}
	for _, h := range got {
		if seen[h] {
			tb.Fatalf("%s: hash %#x listed twice", what, h)
		}
		seen[h] = true
		if !want[h] {
			tb.Fatalf("%s: unexpected hash %#x", what, h)
		}
	}
	if len(seen) != len(want) {
		tb.Fatalf("%s: %d hashes, want %d", what, len(seen), len(want))
	}
}

// TestGetSummarySnapshot inserts 20,480 blocks over gRPC and checks that the streamed summary
// comes in several bounded chunks and is exactly the canonical hashes of what was inserted.
func TestGetSummarySnapshot(t *testing.T) {
	n := startNode(t, local.Options{})
	ctx := testCtx(t)
	const bs = 16
	if s := getSummary(t, n, &pb.GetSummaryRequest{}); s.chunks != 1 || len(s.added) != 0 || s.seq != 0 {
		t.Fatalf("empty tree: %d chunks, %d hashes, seq %d; want one empty chunk at seq 0", s.chunks, len(s.added), s.seq)
	}
	var base, adapted [][]uint32
	for i := range 20 {
		p := prompt(uint32(i)<<20, 1024*bs+7) // 1,024 full blocks and a partial, which has no hash
		adapter := uint64(0)
		if i%4 == 3 {
			adapter = 42
			adapted = append(adapted, p)
		} else {
			base = append(base, p)
		}
		must(n.client.Insert(ctx, &pb.InsertRequest{Tokens: p, BlockTable: blocks(uint32(i)*2000, 1025), BlockSize: bs, AdapterId: adapter}))(t)
	}
	want := hashSet(base, bs, 0)
	for h := range hashSet(adapted, bs, 42) {
		want[h] = true
	}
	s := getSummary(t, n, &pb.GetSummaryRequest{})
	if s.kind != pb.SummaryKind_SUMMARY_KIND_SNAPSHOT || s.chunks < 2 || len(s.removed) != 0 {
		t.Fatalf("got kind %v in %d chunks with %d removed; want a snapshot in >= 2 chunks", s.kind, s.chunks, len(s.removed))
	}
	if wantChunks := (20*1024 + MaxSummaryChunkHashes - 1) / MaxSummaryChunkHashes; s.chunks != wantChunks {
		t.Fatalf("%d chunks for %d hashes, want %d", s.chunks, len(want), wantChunks)
	}
	equalSet(t, "snapshot", s.added, want)
	if head := n.tree.SummaryHead(); s.seq != head {
		t.Fatalf("snapshot seq %d, tree head %d", s.seq, head)
	}
}

// TestGetSummaryDelta checks since_seq: the net changes when the journal still holds them, and
// a full snapshot when it does not, when since_seq is ahead, or when the epoch is another one.
func TestGetSummaryDelta(t *testing.T) {
	n := startNode(t, local.Options{JournalCapacity: 64})
	ctx := testCtx(t)
	const bs = 16
	a, b, c := prompt(1, 4*bs), prompt(1000, 4*bs), prompt(5000, 4*bs)
	insert := func(p []uint32, first uint32) {
		must(n.client.Insert(ctx, &pb.InsertRequest{Tokens: p, BlockTable: blocks(first, 4), BlockSize: bs}))(t)
		must(n.client.Release(ctx, &pb.ReleaseRequest{Tokens: p, BlockSize: bs}))(t)
	}
	insert(a, 10)
	insert(b, 20)
	since := getSummary(t, n, &pb.GetSummaryRequest{}).seq

	// Evict everything (a and b), then insert c and a again: b is removed, c added, and a, removed
	// and re-added, is an add.
	must(n.client.Evict(ctx, &pb.EvictRequest{NumBlocks: 100}))(t)
	insert(c, 30)
	insert(a, 40)
	d := getSummary(t, n, &pb.GetSummaryRequest{SinceSeq: proto.Uint64(since), Epoch: testEpoch})
	if d.kind != pb.SummaryKind_SUMMARY_KIND_DELTA || d.from != since || d.seq != n.tree.SummaryHead() {
		t.Fatalf("got kind %v from %d to %d; want a delta from %d to %d", d.kind, d.from, d.seq, since, n.tree.SummaryHead())
	}
	equalSet(t, "delta added", d.added, hashSet([][]uint32{a, c}, bs, 0))
	equalSet(t, "delta removed", d.removed, hashSet([][]uint32{b}, bs, 0))

	// Applying the delta to the old snapshot gives the new snapshot.
	full := getSummary(t, n, &pb.GetSummaryRequest{})
	equalSet(t, "snapshot after", full.added, hashSet([][]uint32{a, c}, bs, 0))

	// Up to date: an empty delta.
	if d := getSummary(t, n, &pb.GetSummaryRequest{SinceSeq: proto.Uint64(full.seq)}); d.kind != pb.SummaryKind_SUMMARY_KIND_DELTA || len(d.added)+len(d.removed) != 0 {
		t.Fatalf("delta from head: %v with %d+%d hashes, want an empty delta", d.kind, len(d.added), len(d.removed))
	}
	for name, req := range map[string]*pb.GetSummaryRequest{
		"other epoch":   {SinceSeq: proto.Uint64(since), Epoch: testEpoch + 1},
		"ahead of head": {SinceSeq: proto.Uint64(full.seq + 1)},
	} {
		if s := getSummary(t, n, req); s.kind != pb.SummaryKind_SUMMARY_KIND_SNAPSHOT || s.seq != full.seq {
			t.Fatalf("%s: got %v at %d, want a snapshot at %d", name, s.kind, s.seq, full.seq)
		}
	}
	// Push since out of the 64-entry ring.
	for i := range 20 {
		insert(prompt(uint32(9000+i*100), 4*bs), uint32(100+i*4))
	}
	if s := getSummary(t, n, &pb.GetSummaryRequest{SinceSeq: proto.Uint64(since)}); s.kind != pb.SummaryKind_SUMMARY_KIND_SNAPSHOT {
		t.Fatalf("since out of the ring: got %v, want a snapshot", s.kind)
	}
}

// TestNetChanges checks the folding of journal events into net adds and removes.
func TestNetChanges(t *testing.T) {
	ev := []local.SummaryEvent{
		{Seq: 1, Hash: 1, Added: true},
		{Seq: 2, Hash: 2, Added: true},
		{Seq: 3, Hash: 1, Added: false},
		{Seq: 4, Hash: 3, Added: false},
		{Seq: 5, Hash: 3, Added: true},
		{Seq: 6, Hash: 4, Added: false},
	}
	added, removed := netChanges(ev)
	if !sameSet(added, []uint64{2, 3}) || !sameSet(removed, []uint64{1, 4}) {
		t.Fatalf("netChanges = +%v −%v, want +[2 3] −[1 4]", added, removed)
	}
}

// TestNewEpoch: after NewEpoch, Stats and every GetSummary chunk carry the new epoch, a delta
// asked for since a sequence of the old epoch is answered with a snapshot, and one of the new
// epoch is a delta again (the journal's sequence carries on across the change).
func TestNewEpoch(t *testing.T) {
	n := startNode(t, local.Options{})
	ctx := testCtx(t)
	const bs = 16
	a := prompt(1, 4*bs)
	must(n.client.Insert(ctx, &pb.InsertRequest{Tokens: a, BlockTable: blocks(10, 4), BlockSize: bs}))(t)
	since := getSummary(t, n, &pb.GetSummaryRequest{}).seq

	e := n.srv.NewEpoch()
	if e == 0 || e == testEpoch || n.srv.Epoch() != e {
		t.Fatalf("NewEpoch = %#x, Epoch() = %#x; want a fresh non-zero epoch", e, n.srv.Epoch())
	}
	n.epoch = e
	st, err := n.client.Stats(ctx, &pb.StatsRequest{})
	if err != nil || st.GetEpoch() != e {
		t.Fatalf("Stats = %v, %v; want epoch %#x", st, err, e)
	}
	if s := getSummary(t, n, &pb.GetSummaryRequest{SinceSeq: proto.Uint64(since), Epoch: testEpoch}); s.kind != pb.SummaryKind_SUMMARY_KIND_SNAPSHOT || s.seq != since {
		t.Fatalf("delta since the old epoch: got %v at %d, want a snapshot at %d", s.kind, s.seq, since)
	}
	if s := getSummary(t, n, &pb.GetSummaryRequest{SinceSeq: proto.Uint64(since), Epoch: e}); s.kind != pb.SummaryKind_SUMMARY_KIND_DELTA || s.from != since {
		t.Fatalf("delta since the new epoch: got %v from %d, want a delta from %d", s.kind, s.from, since)
	}
	if e2 := n.srv.NewEpoch(); e2 == e || e2 == 0 {
		t.Fatalf("second NewEpoch = %#x, want another fresh epoch than %#x", e2, e)
	}
}
