package node

import (
	"context"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prefixmesh/prefixmesh/local"
	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
)

// TestTreeRPCs drives every tree RPC once over real gRPC and checks the answers against the spec.
func TestTreeRPCs(t *testing.T) {
	n := startNode(t, local.Options{})
	c, ctx := n.client, testCtx(t)
	const bs = 4
	p := prompt(100, 10) // two full blocks and a partial of two tokens

	if r := must(c.IsActive(ctx, &pb.IsActiveRequest{}))(t); !r.GetActive() {
		t.Fatal("IsActive = false for a RadixTree")
	}
	if m := must(c.Lookup(ctx, &pb.LookupRequest{Tokens: p, BlockSize: bs}))(t).GetMatch(); m.GetMatchedTokens() != 0 || len(m.GetMatchedBlocks()) != 0 {
		t.Fatalf("Lookup on empty cache = %v, want empty match", m)
	}
	acq := must(c.Insert(ctx, &pb.InsertRequest{Tokens: p, BlockTable: []uint32{1, 2, 3}, BlockSize: bs}))(t).GetAcquired()
	if !slices.Equal(acq.GetBlocks(), []uint32{1, 2, 3}) || len(acq.GetReleasedBlocks()) != 0 || len(acq.GetDiskBlockIds()) != 0 {
		t.Fatalf("Insert acquired = %v, want blocks [1 2 3] and nothing else", acq)
	}
	if got := must(c.PeekMatchedTokens(ctx, &pb.PeekMatchedTokensRequest{Tokens: p, BlockSize: bs}))(t).GetMatchedTokens(); got != 8 {
		t.Fatalf("Peek(full prompt) = %d, want 8", got)
	}
	if got := must(c.PeekMatchedTokens(ctx, &pb.PeekMatchedTokensRequest{Tokens: p[:6], BlockSize: bs}))(t).GetMatchedTokens(); got != 4 {
		t.Fatalf("Peek(6 tokens) = %d, want 4", got)
	}
	m := must(c.Lookup(ctx, &pb.LookupRequest{Tokens: p, BlockSize: bs}))(t).GetMatch()
	if m.GetMatchedTokens() != 8 || !slices.Equal(m.GetMatchedBlocks(), []uint32{1, 2}) || len(m.GetMatchedDiskBlockIds()) != 0 {
		t.Fatalf("Lookup = %v, want 8 tokens in blocks [1 2]", m)
	}
	must(c.ReleaseMatched(ctx, &pb.ReleaseMatchedRequest{Tokens: p, BlockSize: bs, MatchedTokens: m.GetMatchedTokens()}))(t)
	pinned := must(c.PinPrefix(ctx, &pb.PinPrefixRequest{Tokens: p, BlockSize: bs}))(t).GetMatchedTokens()
	if pinned != 8 {
		t.Fatalf("PinPrefix = %d, want 8", pinned)
	}
	if ev := must(c.Evict(ctx, &pb.EvictRequest{NumBlocks: 10}))(t); len(ev.GetPhysical()) != 0 {
		t.Fatalf("Evict while inserted and pinned = %v, want nothing", ev)
	}
	must(c.ReleaseMatched(ctx, &pb.ReleaseMatchedRequest{Tokens: p, BlockSize: bs, MatchedTokens: pinned}))(t)
	must(c.Release(ctx, &pb.ReleaseRequest{Tokens: p, BlockSize: bs}))(t)

	st := must(c.Stats(ctx, &pb.StatsRequest{}))(t)
	if st.GetNodeId() != "node-a" || st.GetEpoch() != testEpoch || st.GetCachedBlocks() != 2 ||
		st.GetHits() != 1 || st.GetMisses() != 1 || st.GetHitTokens() != 8 || st.GetSummarySeq() != 2 {
		t.Fatalf("Stats = %v, want node-a, epoch %d, 2 blocks, 1 hit of 8 tokens, 1 miss, seq 2", st, testEpoch)
	}
	// The deeper leaf goes first, with the partial block hanging off it; then its parent.
	if ev := must(c.Evict(ctx, &pb.EvictRequest{NumBlocks: 1}))(t); !slices.Equal(ev.GetPhysical(), []uint32{2, 3}) {
		t.Fatalf("Evict(1) = %v, want [2 3] (leaf and its partial)", ev.GetPhysical())
	}
	if ev := must(c.Evict(ctx, &pb.EvictRequest{NumBlocks: 10}))(t); !slices.Equal(ev.GetPhysical(), []uint32{1}) {
		t.Fatalf("Evict(10) = %v, want [1]", ev.GetPhysical())
	}
	if ev := must(c.Evict(ctx, &pb.EvictRequest{NumBlocks: 0}))(t); len(ev.GetPhysical()) != 0 {
		t.Fatalf("Evict(0) = %v, want nothing", ev)
	}

	// Disk (HSS) ids travel in both directions.
	q := prompt(500, 8)
	acq = must(c.Insert(ctx, &pb.InsertRequest{Tokens: q, BlockTable: []uint32{7, 8}, DiskBlockIds: []uint32{70, 71}, BlockSize: bs}))(t).GetAcquired()
	if !slices.Equal(acq.GetDiskBlockIds(), []uint32{70, 71}) {
		t.Fatalf("Insert with disk ids acquired %v, want disk [70 71]", acq)
	}
	m = must(c.Lookup(ctx, &pb.LookupRequest{Tokens: q, BlockSize: bs}))(t).GetMatch()
	if !slices.Equal(m.GetMatchedDiskBlockIds(), []uint32{70, 71}) {
		t.Fatalf("Lookup disk ids = %v, want [70 71]", m.GetMatchedDiskBlockIds())
	}
	must(c.ReleaseMatched(ctx, &pb.ReleaseMatchedRequest{Tokens: q, BlockSize: bs, MatchedTokens: 8}))(t)
	must(c.Release(ctx, &pb.ReleaseRequest{Tokens: q, BlockSize: bs}))(t)
	ev := must(c.Evict(ctx, &pb.EvictRequest{NumBlocks: 2}))(t)
	if !sameSet(ev.GetPhysical(), []uint32{7, 8}) || !sameSet(ev.GetDiskBlockIds(), []uint32{70, 71}) {
		t.Fatalf("Evict = %v, want blocks {7 8} and disk ids {70 71}", ev)
	}

	// Adapters have their own chains.
	must(c.Insert(ctx, &pb.InsertRequest{Tokens: q, BlockTable: []uint32{5, 6}, BlockSize: bs, AdapterId: 9}))(t)
	if got := must(c.PeekMatchedTokens(ctx, &pb.PeekMatchedTokensRequest{Tokens: q, BlockSize: bs}))(t).GetMatchedTokens(); got != 0 {
		t.Fatalf("Peek(base model) after adapter insert = %d, want 0", got)
	}
	if got := must(c.PeekMatchedTokens(ctx, &pb.PeekMatchedTokensRequest{Tokens: q, BlockSize: bs, AdapterId: 9}))(t).GetMatchedTokens(); got != 8 {
		t.Fatalf("Peek(adapter 9) = %d, want 8", got)
	}
}

// TestRefcountBalance checks the holds of two overlapping sequences: while either holds a block
// nothing of it is evicted, and once both released, Evict hands back exactly the blocks the
// cache said it stored (local/CONTRACT.md, "The caller's contract"), no more and no fewer.
func TestRefcountBalance(t *testing.T) {
	n := startNode(t, local.Options{})
	c, ctx := n.client, testCtx(t)
	const bs = 4
	owned := map[uint32]bool{} // blocks the cache stores, per its InsertAcquired reports
	apply := func(a *pb.InsertAcquired) {
		for _, b := range a.GetBlocks() {
			owned[b] = true
		}
		for _, b := range a.GetReleasedBlocks() {
			delete(owned, b)
		}
	}
	evictAll := func() []uint32 {
		return must(c.Evict(ctx, &pb.EvictRequest{NumBlocks: MaxEvictBlocks}))(t).GetPhysical()
	}

	pA := prompt(0, 16)
	if m := must(c.Lookup(ctx, &pb.LookupRequest{Tokens: pA, BlockSize: bs}))(t).GetMatch(); m.GetMatchedTokens() != 0 {
		t.Fatalf("A: Lookup = %d tokens, want 0", m.GetMatchedTokens())
	}
	apply(must(c.Insert(ctx, &pb.InsertRequest{Tokens: pA, BlockTable: []uint32{10, 11, 12, 13}, BlockSize: bs}))(t).GetAcquired())

	pB := append(slices.Clone(pA[:8]), prompt(1000, 8)...)
	mB := must(c.Lookup(ctx, &pb.LookupRequest{Tokens: pB, BlockSize: bs}))(t).GetMatch()
	if mB.GetMatchedTokens() != 8 || !slices.Equal(mB.GetMatchedBlocks(), []uint32{10, 11}) {
		t.Fatalf("B: Lookup = %v, want 8 tokens in [10 11]", mB)
	}
	apply(must(c.Insert(ctx, &pb.InsertRequest{Tokens: pB, BlockTable: []uint32{10, 11, 20, 21}, BlockSize: bs, MatchedTokens: 8}))(t).GetAcquired())

	if got := evictAll(); len(got) != 0 {
		t.Fatalf("Evict with both sequences live = %v, want nothing", got)
	}
	must(c.Release(ctx, &pb.ReleaseRequest{Tokens: pA, BlockSize: bs}))(t)
	gotA := evictAll()
	if !sameSet(gotA, []uint32{12, 13}) {
		t.Fatalf("Evict after A released = %v, want A's own blocks {12 13}", gotA)
	}
	must(c.Release(ctx, &pb.ReleaseRequest{Tokens: pB, BlockSize: bs}))(t)
	gotB := evictAll()
	if !sameSet(gotB, []uint32{10, 11, 20, 21}) {
		t.Fatalf("Evict after B released = %v, want {10 11 20 21}", gotB)
	}
	want := make([]uint32, 0, len(owned))
	for b := range owned {
		want = append(want, b)
	}
	if all := append(gotA, gotB...); !sameSet(all, want) {
		t.Fatalf("evicted %v in total, but the cache reported storing %v", all, want)
	}
	if st := must(c.Stats(ctx, &pb.StatsRequest{}))(t); st.GetCachedBlocks() != 0 {
		t.Fatalf("cached_blocks after evicting all = %d, want 0", st.GetCachedBlocks())
	}
}

// TestEvictionUnderPressure runs an engine-like client over gRPC with a pool of 64 KV blocks and a
// seeded stream of prompts sharing a few system prompts. The client evicts when the pool runs dry.
// After every request: every block is either free or stored by the cache, and the cache's count
// matches the client's.
func TestEvictionUnderPressure(t *testing.T) {
	n := startNode(t, local.Options{})
	c, ctx := n.client, testCtx(t)
	const (
		bs       = 4
		capacity = 64
	)
	free := blocks(1, capacity)
	kvRef := map[uint32]int{} // the client's KV refcount per block (cache refs + sequence refs)
	drop := func(b uint32) {
		if kvRef[b]--; kvRef[b] == 0 {
			delete(kvRef, b)
			free = append(free, b)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var evicted, reused, served int
	for i := range 300 {
		system := prompt(uint32(rng.IntN(6))<<16, 4*bs)
		p := append(system, prompt(uint32(1<<24+i<<8), rng.IntN(5)*bs)...)
		m := must(c.Lookup(ctx, &pb.LookupRequest{Tokens: p, BlockSize: bs}))(t).GetMatch()
		matched := m.GetMatchedBlocks()
		reused += len(matched)
		need := len(p)/bs - len(matched)
		if need > len(free) {
			ev := must(c.Evict(ctx, &pb.EvictRequest{NumBlocks: int64(need - len(free))}))(t)
			evicted += len(ev.GetPhysical())
			for _, b := range ev.GetPhysical() {
				drop(b)
			}
		}
		if need > len(free) {
			t.Fatalf("request %d: %d free blocks after eviction, need %d (pool of %d, prompt of %d blocks)", i, len(free), need, capacity, len(p)/bs)
		}
		table := append(slices.Clone(matched), free[len(free)-need:]...)
		free = free[:len(free)-need]
		for _, b := range table { // the sequence's own ref on every block it uses
			kvRef[b]++
		}
		acq := must(c.Insert(ctx, &pb.InsertRequest{Tokens: p, BlockTable: table, BlockSize: bs, MatchedTokens: m.GetMatchedTokens()}))(t).GetAcquired()
		for _, b := range acq.GetBlocks() {
			kvRef[b]++
		}
		for _, b := range acq.GetReleasedBlocks() {
			drop(b)
		}
		must(c.Release(ctx, &pb.ReleaseRequest{Tokens: p, BlockSize: bs}))(t)
		for _, b := range table {
			drop(b)
		}
		served++

		cached := must(c.Stats(ctx, &pb.StatsRequest{}))(t).GetCachedBlocks()
		if int(cached)+len(free) != capacity || int(cached) != len(kvRef) {
			t.Fatalf("request %d: cache holds %d blocks, client sees %d referenced and %d free of %d",
				i, cached, len(kvRef), len(free), capacity)
		}
	}
	if evicted == 0 || reused == 0 {
		t.Fatalf("served %d requests with %d blocks evicted and %d reused; want pressure and reuse", served, evicted, reused)
	}
	if got, _ := metricValue(t, n.reg, "prefixmesh_node_grpc_evicted_blocks_total"); int(got) != evicted {
		t.Fatalf("grpc_evicted_blocks_total = %v, want %d", got, evicted)
	}
}

// TestSnapshotRPCs drives every snapshot-index RPC: register, look up by session, spill to the
// tier, promote back, drop, forget, evict by slot and by LRU, and the tail/sibling pair.
func TestSnapshotRPCs(t *testing.T) {
	n := startNode(t, local.Options{})
	c, ctx := n.client, testCtx(t)
	const (
		bs      = 4
		session = 77
	)
	p := prompt(1, 12)
	lookup := func() *pb.PrefixMatch {
		m := must(c.Lookup(ctx, &pb.LookupRequest{Tokens: p, BlockSize: bs, SessionHash: session}))(t).GetMatch()
		must(c.ReleaseMatched(ctx, &pb.ReleaseMatchedRequest{Tokens: p, BlockSize: bs, MatchedTokens: m.GetMatchedTokens()}))(t)
		return m
	}
	count := func() int64 { return must(c.SnapshotCount(ctx, &pb.SnapshotCountRequest{}))(t).GetCount() }

	r := must(c.InsertWithSnapshot(ctx, &pb.InsertWithSnapshotRequest{Tokens: p, BlockTable: []uint32{1, 2, 3}, BlockSize: bs, SnapshotId: 1, SessionHash: session}))(t)
	if r.GetHasDisplaced() || !slices.Equal(r.GetAcquired().GetBlocks(), []uint32{1, 2, 3}) {
		t.Fatalf("InsertWithSnapshot = %v, want no displaced slot and blocks [1 2 3]", r)
	}
	must(c.Release(ctx, &pb.ReleaseRequest{Tokens: p, BlockSize: bs}))(t)
	if m := lookup(); !m.GetHasSsmSnapshot() || m.GetSsmSnapshot() != 1 || m.GetSsmSnapshotTokens() != 12 {
		t.Fatalf("Lookup = %v, want resident snapshot in slot 1 at 12 tokens", m)
	}
	if got := count(); got != 1 {
		t.Fatalf("SnapshotCount = %d, want 1", got)
	}

	// Spill (min_tokens 0 always spills), find it in the tier, promote it back.
	te := must(c.EvictSnapshotToTier(ctx, &pb.EvictSnapshotToTierRequest{MinTokens: 0}))(t)
	if !te.GetHasTierEvict() || !te.GetTierEvict().GetSpill() || te.GetTierEvict().GetSlot() != 1 || te.GetTierEvict().GetDepth() != 12 {
		t.Fatalf("EvictSnapshotToTier(0) = %v, want Spill of slot 1 at depth 12", te)
	}
	key := te.GetTierEvict().GetKey()
	if m := lookup(); m.GetHasSsmSnapshot() || !m.GetHasSsmSnapshotTier() || m.GetSsmSnapshotTierKey() != key || m.GetSsmSnapshotTierTokens() != 12 {
		t.Fatalf("Lookup after spill = %v, want tier key %#x at 12 tokens", m, key)
	}
	if !must(c.PromoteSnapshot(ctx, &pb.PromoteSnapshotRequest{Key: key, NewSlot: 9}))(t).GetPromoted() {
		t.Fatal("PromoteSnapshot(spilled key) = false")
	}
	if must(c.PromoteSnapshot(ctx, &pb.PromoteSnapshotRequest{Key: key, NewSlot: 10}))(t).GetPromoted() {
		t.Fatal("PromoteSnapshot(resident key) = true, want false (local/CONTRACT.md, Promote and forget)")
	}
	if m := lookup(); !m.GetHasSsmSnapshot() || m.GetSsmSnapshot() != 9 {
		t.Fatalf("Lookup after promote = %v, want resident slot 9", m)
	}
	// A victim shallower than min_tokens is dropped.
	te = must(c.EvictSnapshotToTier(ctx, &pb.EvictSnapshotToTierRequest{MinTokens: 13}))(t)
	if !te.GetHasTierEvict() || te.GetTierEvict().GetSpill() || te.GetTierEvict().GetSlot() != 9 {
		t.Fatalf("EvictSnapshotToTier(13) = %v, want Drop of slot 9", te)
	}
	if got := count(); got != 0 {
		t.Fatalf("SnapshotCount after drop = %d, want 0", got)
	}
	if te := must(c.EvictSnapshotToTier(ctx, &pb.EvictSnapshotToTierRequest{}))(t); te.GetHasTierEvict() {
		t.Fatalf("EvictSnapshotToTier on empty index = %v, want none", te)
	}

	// Spill then forget: only the first forget succeeds.
	ri := must(c.InsertIntermediateSnapshot(ctx, &pb.InsertIntermediateSnapshotRequest{Tokens: p[:8], SnapshotId: 2, SessionHash: session}))(t)
	if ri.GetHasDisplaced() {
		t.Fatalf("InsertIntermediateSnapshot = %v, want nothing displaced", ri)
	}
	key = must(c.EvictSnapshotToTier(ctx, &pb.EvictSnapshotToTierRequest{}))(t).GetTierEvict().GetKey()
	if !must(c.ForgetSnapshotTierKey(ctx, &pb.ForgetSnapshotTierKeyRequest{Key: key}))(t).GetForgotten() {
		t.Fatal("ForgetSnapshotTierKey(spilled) = false")
	}
	if must(c.ForgetSnapshotTierKey(ctx, &pb.ForgetSnapshotTierKeyRequest{Key: key}))(t).GetForgotten() {
		t.Fatal("second ForgetSnapshotTierKey = true")
	}

	// Re-registering a key in another slot displaces the old slot.
	must(c.InsertIntermediateSnapshot(ctx, &pb.InsertIntermediateSnapshotRequest{Tokens: p[:8], SnapshotId: 3}))(t)
	ri = must(c.InsertIntermediateSnapshot(ctx, &pb.InsertIntermediateSnapshotRequest{Tokens: p[:8], SnapshotId: 4}))(t)
	if !ri.GetHasDisplaced() || ri.GetDisplaced() != 3 {
		t.Fatalf("re-register in slot 4 = %v, want slot 3 displaced", ri)
	}
	if !must(c.EvictSnapshotSlot(ctx, &pb.EvictSnapshotSlotRequest{Slot: 4}))(t).GetEvicted() {
		t.Fatal("EvictSnapshotSlot(4) = false")
	}
	if must(c.EvictSnapshotSlot(ctx, &pb.EvictSnapshotSlotRequest{Slot: 4}))(t).GetEvicted() {
		t.Fatal("second EvictSnapshotSlot(4) = true")
	}
	must(c.InsertIntermediateSnapshot(ctx, &pb.InsertIntermediateSnapshotRequest{Tokens: p[:4], SnapshotId: 5}))(t)
	if r := must(c.EvictSnapshotLRU(ctx, &pb.EvictSnapshotLRURequest{}))(t); !r.GetHasSlot() || r.GetSlot() != 5 {
		t.Fatalf("EvictSnapshotLRU = %v, want slot 5", r)
	}
	if r := must(c.EvictSnapshotLRU(ctx, &pb.EvictSnapshotLRURequest{}))(t); r.GetHasSlot() {
		t.Fatalf("EvictSnapshotLRU on empty index = %v, want none", r)
	}

	// Tail and sibling; the session's next tail sweeps both.
	if d := must(c.InsertTailSnapshot(ctx, &pb.InsertTailSnapshotRequest{Tokens: p[:8], SnapshotId: 6, SessionHash: session}))(t).GetDisplaced(); len(d) != 0 {
		t.Fatalf("first InsertTailSnapshot displaced %v, want none", d)
	}
	if r := must(c.InsertTailSiblingSnapshot(ctx, &pb.InsertTailSiblingSnapshotRequest{Tokens: p[:4], SnapshotId: 7, SessionHash: session}))(t); r.GetHasDisplaced() {
		t.Fatalf("InsertTailSiblingSnapshot = %v, want nothing displaced", r)
	}
	d := must(c.InsertTailSnapshot(ctx, &pb.InsertTailSnapshotRequest{Tokens: p, SnapshotId: 8, SessionHash: session}))(t).GetDisplaced()
	if !sameSet(d, []int64{6, 7}) {
		t.Fatalf("next InsertTailSnapshot displaced %v, want the old tail and sibling {6 7}", d)
	}
	if m := lookup(); !m.GetHasSsmSnapshot() || m.GetSsmSnapshot() != 8 || !m.GetSsmSnapshotIsTail() {
		t.Fatalf("Lookup = %v, want the tail in slot 8", m)
	}

	st := must(c.Stats(ctx, &pb.StatsRequest{}))(t)
	if st.GetSnapshotCount() != 1 || st.GetSnapshot().GetTierSpills() != 2 || st.GetSnapshot().GetTierFaultIns() != 1 || st.GetSnapshot().GetTierReaps() != 1 {
		t.Fatalf("Stats = %v, want 1 snapshot, 2 spills, 1 fault-in, 1 reap", st)
	}
}

// TestMetrics checks that the interceptor counts calls by method and code and that the tree's
// counters are exported at scrape time.
func TestMetrics(t *testing.T) {
	n := startNode(t, local.Options{})
	c, ctx := n.client, testCtx(t)
	p := prompt(1, 32)
	must(c.Insert(ctx, &pb.InsertRequest{Tokens: p, BlockTable: blocks(1, 2), BlockSize: 16}))(t)
	must(c.Lookup(ctx, &pb.LookupRequest{Tokens: p, BlockSize: 16}))(t)
	must(c.Lookup(ctx, &pb.LookupRequest{Tokens: prompt(999, 16), BlockSize: 16}))(t)
	if _, err := c.Lookup(ctx, &pb.LookupRequest{Tokens: p}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("Lookup without block_size: %v, want InvalidArgument", err)
	}
	for _, tc := range []struct {
		name string
		want float64
	}{
		{"prefixmesh_node_cache_hits_total", 1},
		{"prefixmesh_node_cache_misses_total", 1},
		{"prefixmesh_node_cache_matched_tokens_total", 32},
		{"prefixmesh_node_cache_cached_blocks", 2},
		{"prefixmesh_node_cache_summary_seq", 2},
	} {
		if got, _ := metricValue(t, n.reg, tc.name); got != tc.want {
			t.Errorf("%s = %v, want %v", tc.name, got, tc.want)
		}
	}
	const lookup = "prefixmesh.v1.NodeCache/Lookup"
	for _, tc := range []struct {
		code string
		want float64
	}{{"OK", 2}, {"InvalidArgument", 1}} {
		if got, _ := metricValue(t, n.reg, "prefixmesh_node_grpc_requests_total", "method", lookup, "code", tc.code); got != tc.want {
			t.Errorf("grpc_requests_total{Lookup,%s} = %v, want %v", tc.code, got, tc.want)
		}
	}
	if got, series := metricValue(t, n.reg, "prefixmesh_node_grpc_request_duration_seconds"); got != 4 || series != 3 {
		t.Errorf("latency histograms: %v observations in %d series, want 4 in 3 (Insert OK, Lookup OK, Lookup InvalidArgument)", got, series)
	}
}

// TestPanicBecomesInternal checks the interceptor's recovery: a panicking handler answers
// Internal and the metrics count it.
func TestPanicBecomesInternal(t *testing.T) {
	n := startNode(t, local.Options{})
	info := &grpc.UnaryServerInfo{FullMethod: "/prefixmesh.v1.NodeCache/Boom"}
	_, err := n.srv.unaryInterceptor(context.Background(), nil, info, func(context.Context, any) (any, error) {
		panic("boom")
	})
	if status.Code(err) != codes.Internal {
		t.Fatalf("panicking handler returned %v, want Internal", err)
	}
	if got, _ := metricValue(t, n.reg, "prefixmesh_node_grpc_requests_total", "method", "prefixmesh.v1.NodeCache/Boom", "code", "Internal"); got != 1 {
		t.Fatalf("requests{Boom,Internal} = %v, want 1", got)
	}
}

// TestReadOnly checks that a read-only server (an in-process engine owns the tree) answers the
// calls that change nothing and refuses the others with FailedPrecondition, leaving the tree as
// it was.
func TestReadOnly(t *testing.T) {
	tree := local.NewRadixTree(local.Options{})
	p := prompt(1, 32)
	tree.Insert(p, blocks(1, 2), nil, 16, 0, 0)
	srv := must(New(tree, Config{NodeID: "ro", ReadOnly: true}))(t)
	ctx := testCtx(t)
	if r := must(srv.PeekMatchedTokens(ctx, &pb.PeekMatchedTokensRequest{Tokens: p, BlockSize: 16}))(t); r.GetMatchedTokens() != 32 {
		t.Fatalf("Peek = %d, want 32", r.GetMatchedTokens())
	}
	must(srv.Stats(ctx, &pb.StatsRequest{}))(t)
	must(srv.SnapshotCount(ctx, &pb.SnapshotCountRequest{}))(t)
	must(srv.IsActive(ctx, &pb.IsActiveRequest{}))(t)
	for name, call := range map[string]func() error{
		"Lookup":    func() error { _, err := srv.Lookup(ctx, &pb.LookupRequest{Tokens: p, BlockSize: 16}); return err },
		"PinPrefix": func() error { _, err := srv.PinPrefix(ctx, &pb.PinPrefixRequest{Tokens: p, BlockSize: 16}); return err },
		"Insert": func() error {
			_, err := srv.Insert(ctx, &pb.InsertRequest{Tokens: p, BlockTable: blocks(5, 2), BlockSize: 16})
			return err
		},
		"Release":          func() error { _, err := srv.Release(ctx, &pb.ReleaseRequest{Tokens: p, BlockSize: 16}); return err },
		"Evict":            func() error { _, err := srv.Evict(ctx, &pb.EvictRequest{NumBlocks: 10}); return err },
		"EvictSnapshotLRU": func() error { _, err := srv.EvictSnapshotLRU(ctx, &pb.EvictSnapshotLRURequest{}); return err },
		"ForgetSnapshotTierKey": func() error {
			_, err := srv.ForgetSnapshotTierKey(ctx, &pb.ForgetSnapshotTierKeyRequest{Key: 1})
			return err
		},
	} {
		err := call()
		if status.Code(err) != codes.FailedPrecondition {
			t.Errorf("%s on a read-only server: %v, want FailedPrecondition", name, err)
		}
		if !strings.Contains(status.Convert(err).Message(), "owned by the in-process engine") {
			t.Errorf("%s: message %q does not name the owner", name, status.Convert(err).Message())
		}
	}
	// A mirror names its engine instead.
	mirror := must(New(tree, Config{NodeID: "mirror", ReadOnly: true, Owner: "the vllm engine beside this agent"}))(t)
	if _, err := mirror.Lookup(ctx, &pb.LookupRequest{Tokens: p, BlockSize: 16}); !strings.Contains(status.Convert(err).Message(),
		"the prefix cache is owned by the vllm engine beside this agent") {
		t.Errorf("mirror's refusal: %v", err)
	}
	if hs := tree.HitStats(); hs.Hits+hs.Misses != 0 {
		t.Fatalf("read-only server touched the tree: %+v", hs)
	}
	if _, blocks := tree.Stats(); blocks != 2 {
		t.Fatalf("cached blocks = %d, want 2", blocks)
	}
}

// TestPeekUsesNodeBlockSize: a PeekMatchedTokens without block_size is answered with the node's
// configured block size, and refused (InvalidArgument) only when the node has none.
func TestPeekUsesNodeBlockSize(t *testing.T) {
	tree := local.NewRadixTree(local.Options{})
	p := prompt(1, 40)
	tree.Insert(p[:32], blocks(1, 2), nil, 16, 0, 0)
	ctx := testCtx(t)
	srv := must(New(tree, Config{NodeID: "n", BlockSize: 16, ReadOnly: true}))(t)
	if r := must(srv.PeekMatchedTokens(ctx, &pb.PeekMatchedTokensRequest{Tokens: p}))(t); r.GetMatchedTokens() != 32 {
		t.Fatalf("Peek without block_size = %d, want 32 (two 16-token blocks)", r.GetMatchedTokens())
	}
	unknown := must(New(tree, Config{NodeID: "n"}))(t)
	if _, err := unknown.PeekMatchedTokens(ctx, &pb.PeekMatchedTokensRequest{Tokens: p}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("Peek without block_size on a node without one: %v, want InvalidArgument", err)
	}
}

// TestNewErrors checks New's refusals and that two servers cannot share a registry.
func TestNewErrors(t *testing.T) {
	if _, err := New(nil, Config{}); err == nil {
		t.Error("New(nil tree) succeeded")
	}
	tree := local.NewRadixTree(local.Options{})
	if _, err := New(tree, Config{BlockSize: MaxBlockSize + 1}); err == nil {
		t.Error("New with block size over MaxBlockSize succeeded")
	}
	reg := prometheus.NewRegistry()
	if _, err := New(tree, Config{Registry: reg}); err != nil {
		t.Fatal(err)
	}
	if _, err := New(tree, Config{Registry: reg}); err == nil {
		t.Error("second New on the same registry succeeded (duplicate metrics)")
	}
	a, b := must(New(tree, Config{}))(t), must(New(tree, Config{}))(t)
	if a.Epoch() == 0 || a.Epoch() == b.Epoch() {
		t.Errorf("epochs %#x and %#x: want random, non-zero and distinct", a.Epoch(), b.Epoch())
	}
}
