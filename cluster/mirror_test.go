package cluster

import (
	"errors"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/prefixmesh/prefixmesh/routing"
)

// mirrorHarness drives a SummaryMirror synchronously: no run loop, a fake clock, repairs completed
// in the calling goroutine.
type mirrorHarness struct {
	t       *testing.T
	mi      *SummaryMirror
	idx     *routing.Index
	src     *fakeSource
	fetch   *snapshotFetcher
	members []Meta
	clock   time.Time
	epoch   uint64
}

func newMirrorHarness(t *testing.T) *mirrorHarness {
	cfg := DefaultConfig(RoleRouter, "r")
	cfg.InboxSize = 4
	cfg.Logger = slog.New(slog.DiscardHandler)
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	h := &mirrorHarness{t: t, idx: routing.NewIndex(routing.DefaultIndexConfig()), src: newFakeSource(), epoch: 11,
		clock: time.Unix(1000, 0)}
	h.fetch = &snapshotFetcher{sources: map[string]*fakeSource{"n1": h.src}, epochs: map[string]uint64{"n1": h.epoch}}
	h.members = []Meta{{Role: RoleNode, NodeID: "n1", Epoch: h.epoch}, {Role: RoleRouter, NodeID: "r"}}
	h.mi = newSummaryMirror(&cfg, h.idx, h.fetch, m, func() []Meta { return h.members })
	h.mi.now = func() time.Time { return h.clock }
	h.mi.reconcile()
	h.repair()
	return h
}

// repair runs every pending repair to completion.
func (h *mirrorHarness) repair() {
	h.t.Helper()
	for _, p := range h.mi.peers {
		if p.needRepair && !h.clock.Before(p.repairAfter) {
			p.needRepair = false
			s, err := h.fetch.FetchSummary(nil, p.meta)
			h.mi.finishRepair(repairResult{node: p.meta.NodeID, gen: p.gen, sum: s, err: err})
		}
	}
}

// deltas returns the source's events (from, to] encoded as one delta packet.
func (h *mirrorHarness) delta(from, to uint64) []byte {
	h.t.Helper()
	ev, _, ok := h.src.SummarySince(from, nil)
	if !ok {
		h.t.Fatal("journal lost events")
	}
	d := Delta{NodeID: "n1", Epoch: h.epoch, FromSeq: from, ToSeq: to, EmitUnix: h.clock.UnixNano()}
	for _, e := range ev[:to-from] {
		d.Events = append(d.Events, Event{Hash: e.Hash, Added: e.Added})
	}
	b, err := d.AppendBinary(nil)
	if err != nil {
		h.t.Fatal(err)
	}
	return b
}

func (h *mirrorHarness) state(seq, sum uint64) []byte {
	s := State{NodeID: "n1", Epoch: h.epoch, HeadSeq: seq, Checksum: sum}
	b, _ := s.AppendBinary(nil)
	return b
}

// check fails unless the index holds exactly the source's set for n1 at its head.
func (h *mirrorHarness) check() {
	h.t.Helper()
	want, head := h.src.SummarySnapshot(nil)
	_, seq, blocks, ok := h.idx.NodeState("n1")
	if !ok || seq != head || blocks != len(want) {
		h.t.Fatalf("index at seq %d with %d blocks (ok=%v), source at %d with %d", seq, blocks, ok, head, len(want))
	}
	got := make([]int, 1)
	for _, hsh := range want {
		h.idx.Estimate([]uint64{hsh}, []string{"n1"}, got)
		if got[0] != 1 {
			h.t.Fatalf("hash %x missing from the index", hsh)
		}
	}
	if p := h.mi.peers["n1"]; p.sum != SetChecksum(want) {
		h.t.Fatal("mirror checksum differs from the source's")
	}
}

func (h *mirrorHarness) repairs() int {
	h.fetch.mu.Lock()
	defer h.fetch.mu.Unlock()
	return h.fetch.calls
}

func TestMirrorInOrderAndReordered(t *testing.T) {
	h := newMirrorHarness(t)
	for i := uint64(1); i <= 5; i++ {
		h.src.change(i, true)
	}
	h.src.change(2, false)
	d1, d2 := h.delta(0, 3), h.delta(3, 6)
	h.mi.handle(d2) // ahead of d1: held
	if _, seq, _, _ := h.idx.NodeState("n1"); seq != 0 {
		t.Fatalf("a delta after a gap was applied (seq %d)", seq)
	}
	h.mi.handle(d1)
	h.check()
	h.mi.handle(d1) // duplicate: ignored
	h.check()
	if n := h.repairs(); n != 1 {
		t.Fatalf("%d repairs, want only the join's", n)
	}
	h.clock = h.clock.Add(h.mi.cfg.SilenceTimeout + time.Millisecond)
	h.mi.tick() // silence: no packet for longer than SilenceTimeout
	if p := h.mi.peers["n1"]; !p.needRepair || p.reason != "silence" {
		t.Fatal("silence did not request a repair")
	}
}

func TestMirrorGapRepairs(t *testing.T) {
	h := newMirrorHarness(t)
	for i := uint64(1); i <= 6; i++ {
		h.src.change(i, true)
	}
	h.mi.handle(h.delta(3, 6)) // (0, 3] was lost
	h.clock = h.clock.Add(h.mi.cfg.ReorderWindow / 2)
	h.mi.tick()
	if h.mi.peers["n1"].needRepair {
		t.Fatal("repair before the reorder window passed")
	}
	h.clock = h.clock.Add(h.mi.cfg.ReorderWindow)
	h.mi.tick()
	if !h.mi.peers["n1"].needRepair || h.mi.peers["n1"].reason != "gap" {
		t.Fatal("gap not repaired after the reorder window")
	}
	h.repair()
	h.check()
	// Deltas after the repaired sequence apply normally.
	h.src.change(1, false)
	h.mi.handle(h.delta(6, 7))
	h.check()
}

func TestMirrorLostLastDeltaFoundByState(t *testing.T) {
	h := newMirrorHarness(t)
	h.src.change(1, true)
	h.src.change(2, true)
	h.mi.handle(h.delta(0, 1)) // (1, 2] is lost and the node goes quiet
	h.mi.handle(h.state(2, SetChecksum([]uint64{1, 2})))
	h.clock = h.clock.Add(h.mi.cfg.LagTimeout + time.Millisecond)
	h.mi.tick()
	if p := h.mi.peers["n1"]; !p.needRepair || p.reason != "behind" {
		t.Fatalf("quiet node behind: needRepair=%v reason=%q", p.needRepair, p.reason)
	}
	h.repair()
	h.check()
	// A state packet overtaken by later deltas says less than the index knows: ignored.
	h.mi.handle(h.state(1, 777))
	if h.mi.peers["n1"].needRepair {
		t.Fatal("a stale state packet triggered a repair")
	}
}

func TestMirrorChecksumMismatchRepairs(t *testing.T) {
	h := newMirrorHarness(t)
	h.src.change(7, true)
	h.mi.handle(h.delta(0, 1))
	h.check()
	h.mi.handle(h.state(1, 12345)) // same sequence, other set
	if p := h.mi.peers["n1"]; !p.needRepair || p.reason != "checksum" {
		t.Fatal("checksum mismatch not repaired")
	}
	// The push/pull vector of the node itself is authoritative too; another router's is not.
	h.repair()
	v := Vector{Role: RoleRouter, From: "r2", Entries: []VersionEntry{{"n1", h.epoch, 1, 999}}}
	b, _ := v.AppendBinary(nil)
	h.mi.handle(b)
	if h.mi.peers["n1"].needRepair {
		t.Fatal("another router's checksum triggered a repair")
	}
	v = Vector{Role: RoleNode, From: "n1", Entries: []VersionEntry{{"n1", h.epoch, 1, 999}}}
	b, _ = v.AppendBinary(nil)
	h.mi.handle(b)
	if !h.mi.peers["n1"].needRepair {
		t.Fatal("the node's own push/pull checksum did not trigger a repair")
	}
}

func TestMirrorEpochChangeAndLeave(t *testing.T) {
	h := newMirrorHarness(t)
	h.src.change(1, true)
	h.mi.handle(h.delta(0, 1))
	h.check()
	// Restart: new epoch, empty cache. The old summary is dropped before any repair.
	h.epoch = 12
	h.src = newFakeSource()
	h.fetch.sources["n1"], h.fetch.epochs["n1"] = h.src, h.epoch
	h.members[0].Epoch = h.epoch
	h.mi.reconcile()
	if _, _, _, ok := h.idx.NodeState("n1"); ok {
		t.Fatal("old epoch's summary survived the restart")
	}
	// An old-epoch packet still in flight is dropped.
	old := Delta{NodeID: "n1", Epoch: 11, FromSeq: 1, ToSeq: 2, Events: []Event{{5, true}}}
	b, _ := old.AppendBinary(nil)
	h.mi.handle(b)
	h.repair()
	h.check()
	// A repair answering with another epoch (metadata lagging) is retried, not installed.
	h.fetch.epochs["n1"] = 13
	h.mi.peers["n1"].needRepair = true
	h.repair()
	if p := h.mi.peers["n1"]; !p.needRepair || p.failures != 1 {
		t.Fatal("a summary of another epoch was accepted")
	}
	// Leave: removed at once.
	h.members = h.members[1:]
	h.mi.reconcile()
	if _, _, _, ok := h.idx.NodeState("n1"); ok || len(h.mi.peers) != 0 {
		t.Fatal("node that left is still indexed")
	}
}

func TestMirrorRepairFailureBacksOff(t *testing.T) {
	h := newMirrorHarness(t)
	h.fetch.fail = errors.New("unreachable")
	h.mi.peers["n1"].needRepair = true
	h.repair()
	p := h.mi.peers["n1"]
	if !p.needRepair || !p.repairAfter.After(h.clock) {
		t.Fatal("failed repair not retried with backoff")
	}
	before := h.repairs()
	h.repair() // too early
	if h.repairs() != before {
		t.Fatal("retried before the backoff")
	}
	h.fetch.fail = nil
	h.clock = p.repairAfter
	h.repair()
	h.check()
}

func TestMirrorNeverBlocksAndCountsDrops(t *testing.T) {
	h := newMirrorHarness(t)
	for i := 0; i < 10; i++ { // inbox of 4, nobody draining
		h.mi.deliver([]byte{msgDelta})
	}
	if got := counterValue(h.mi.metrics.drops.WithLabelValues("inbox_full")); got != 6 {
		t.Fatalf("%v inbox drops, want 6", got)
	}
	// Garbage and unknown nodes are counted, not applied.
	h.mi.handle([]byte{msgDelta, 9, 9})
	unknown := Delta{NodeID: "ghost", Epoch: 1, FromSeq: 0, ToSeq: 1, Events: []Event{{1, true}}}
	b, _ := unknown.AppendBinary(nil)
	h.mi.handle(b)
	if counterValue(h.mi.metrics.drops.WithLabelValues("decode")) != 1 || counterValue(h.mi.metrics.drops.WithLabelValues("unknown_node")) != 1 {
		t.Fatal("drops not counted")
	}
	if slices.Contains(h.idx.Nodes(), "ghost") {
		t.Fatal("unknown node indexed")
	}
}
