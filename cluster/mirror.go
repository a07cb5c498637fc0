package cluster

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prefixmesh/prefixmesh/routing"
)

// Index is the part of routing.Index the mirror feeds.
type Index interface {
	ApplyDelta(node string, epoch, fromSeq, toSeq uint64, events []routing.Change) error
	ReplaceNode(node string, epoch, seq uint64, hashes []uint64)
	RemoveNode(node string)
}

var _ Index = (*routing.Index)(nil)

// NodeStatus is the router's view of one node member.
type NodeStatus struct {
	Meta     Meta
	Load     Load
	LoadRecv time.Time // when the router received Load (its own clock)
	Synced   bool      // the index has held a full summary of this epoch at least once
	Seq      uint64    // summary sequence the index is at
}

// SummaryMirror is a router's copy of every node's summary. One goroutine (run) owns all per-node state;
// gossip callbacks hand it copied packets through a bounded inbox, repairs run on their own
// goroutines and report back through a channel, and readers see an immutable snapshot of the
// node list (Nodes).
type SummaryMirror struct {
	cfg     *Config
	idx     Index
	fetch   Fetcher
	metrics *metrics
	now     func() time.Time

	inbox   chan []byte   // copied packets and push/pull states; full → drop
	dirty   chan struct{} // membership changed (capacity 1)
	results chan repairResult

	members func() []Meta // node members memberlist considers alive

	// Owned by run.
	peers      map[string]*peer
	inflight   int // repairs running
	scratch    []routing.Change
	delta      Delta
	reconciled bool

	view atomic.Pointer[view] // published after every change readers care about
}

// view is what readers of the mirror see.
type view struct {
	nodes  []NodeStatus // sorted by node id
	synced bool         // a membership list has been read and every node in it synced once
	vector []VersionEntry
}

type peer struct {
	meta     Meta
	inIndex  bool   // the index holds this epoch's summary (perhaps behind)
	synced   bool   // inIndex has been true at least once this epoch
	seq, sum uint64 // sequence the index is at, and the summary checksum there

	held      []Delta   // deltas that start after seq, sorted by FromSeq
	heldSince time.Time // when the current gap was first seen

	want      uint64    // a later sequence someone reported, not reached yet
	wantSince time.Time // when want was first above seq

	needRepair  bool
	repairing   bool
	gen         uint64 // bumped when the peer's epoch or membership changes: stale repairs are ignored
	failures    int
	repairAfter time.Time
	reason      string

	lastHeard time.Time
	load      Load
	loadRecv  time.Time
}

type repairResult struct {
	node string
	gen  uint64
	sum  Summary
	err  error
}

func newSummaryMirror(cfg *Config, idx Index, fetch Fetcher, m *metrics, members func() []Meta) *SummaryMirror {
	mi := &SummaryMirror{
		cfg:     cfg,
		idx:     idx,
		fetch:   fetch,
		metrics: m,
		now:     time.Now,
		inbox:   make(chan []byte, cfg.InboxSize),
		dirty:   make(chan struct{}, 1),
		results: make(chan repairResult, cfg.RepairConcurrency),
		members: members,
		peers:   make(map[string]*peer),
	}
	mi.view.Store(&view{})
	return mi
}

// deliver hands a packet to the mirror without blocking; the caller must not reuse b.
func (mi *SummaryMirror) deliver(b []byte) {
	select {
	case mi.inbox <- b:
	default:
		mi.metrics.drop("inbox_full")
	}
}

// membershipChanged tells run to re-read the member list.
func (mi *SummaryMirror) membershipChanged() {
	select {
	case mi.dirty <- struct{}{}:
	default:
	}
}

// Nodes returns the node members and their state, sorted by node id. The slice is shared: do not
// modify it.
func (mi *SummaryMirror) Nodes() []NodeStatus { return mi.view.Load().nodes }

// Synced reports whether the mirror has read the member list and every node in it has been
// synced once: the router's health turns SERVING then.
func (mi *SummaryMirror) Synced() bool { return mi.view.Load().synced }

// run owns the mirror's state until ctx ends; it waits for the repairs it started.
func (mi *SummaryMirror) run(ctx context.Context) {
	var repairs sync.WaitGroup
	defer repairs.Wait()
	tick := time.NewTicker(mi.cfg.TickInterval)
	defer tick.Stop()
	mi.reconcile()
	mi.startRepairs(ctx, &repairs)
	mi.publish()
	for {
		changed := false
		select {
		case <-ctx.Done():
			return
		case b := <-mi.inbox:
			changed = mi.handle(b)
			// Drain what is already queued before publishing the view.
			for n := 0; n < 256; n++ {
				select {
				case b := <-mi.inbox:
					changed = mi.handle(b) || changed
					continue
				default:
				}
				break
			}
		case <-mi.dirty:
			mi.reconcile()
			changed = true
		case r := <-mi.results:
			mi.inflight--
			mi.finishRepair(r)
			changed = true
		case <-tick.C:
			changed = mi.tick()
		}
		mi.startRepairs(ctx, &repairs)
		if changed {
			mi.publish()
		}
	}
}

// handle decodes one packet and applies it; it reports whether the view changed.
func (mi *SummaryMirror) handle(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	mi.metrics.received(b[0], len(b))
	switch b[0] {
	case msgDelta:
		if err := mi.delta.UnmarshalBinary(b); err != nil {
			mi.metrics.drop("decode")
			return false
		}
		return mi.handleDelta(&mi.delta)
	case msgState:
		var s State
		if err := s.UnmarshalBinary(b); err != nil {
			mi.metrics.drop("decode")
			return false
		}
		mi.handleState(&s)
		return true
	case msgPush:
		var v Vector
		if err := v.UnmarshalBinary(b); err != nil {
			mi.metrics.drop("decode")
			return false
		}
		mi.handleVector(&v)
		return false
	default:
		mi.metrics.drop("decode")
		return false
	}
}

// lookup returns the peer a message from (node, epoch) is about, or nil when the message is to
// be dropped: unknown node, or an epoch other than the member's (a restarted node's old packets,
// or a new epoch whose metadata has not reached us yet, in which case we re-read the members).
func (mi *SummaryMirror) lookup(node string, epoch uint64) *peer {
	p := mi.peers[node]
	if p == nil {
		mi.metrics.drop("unknown_node")
		mi.membershipChanged()
		return nil
	}
	if epoch != p.meta.Epoch {
		mi.metrics.drop("other_epoch")
		mi.membershipChanged()
		return nil
	}
	p.lastHeard = mi.now()
	return p
}

func (mi *SummaryMirror) handleDelta(d *Delta) bool {
	p := mi.lookup(d.NodeID, d.Epoch)
	if p == nil {
		return false
	}
	if d.EmitUnix > 0 {
		mi.metrics.lag.Observe(max(0, mi.now().Sub(time.Unix(0, d.EmitUnix)).Seconds()))
	}
	if p.inIndex && !p.repairing && d.ToSeq <= p.seq {
		mi.metrics.drop("duplicate")
		return false
	}
	if !p.inIndex || p.repairing || d.FromSeq > p.seq {
		if p.inIndex && !p.repairing {
			mi.metrics.held.Inc()
		}
		mi.hold(p, d)
		return false
	}
	if !mi.apply(p, d) {
		return false
	}
	mi.drainHeld(p)
	return true
}

// hold keeps a delta that cannot be applied yet: it starts after the index's sequence
// (reordered, or a gap), or a repair is running.
func (mi *SummaryMirror) hold(p *peer, d *Delta) {
	if len(p.held) >= mi.cfg.MaxHeldDeltas {
		mi.metrics.drop("held_overflow")
		p.held = p.held[:0]
		mi.requestRepair(p, "held_overflow")
		return
	}
	c := *d
	c.Events = slices.Clone(d.Events)
	i, _ := slices.BinarySearchFunc(p.held, c.FromSeq, func(x Delta, from uint64) int {
		return cmpU64(x.FromSeq, from)
	})
	p.held = slices.Insert(p.held, i, c)
	if p.heldSince.IsZero() {
		p.heldSince = mi.now()
	}
}

// apply feeds d (with FromSeq ≤ p.seq < ToSeq) to the index, skipping the events the index
// already has; events are one per sequence number (the tree's journal). On failure it requests
// a repair and reports false.
func (mi *SummaryMirror) apply(p *peer, d *Delta) bool {
	if uint64(len(d.Events)) != d.ToSeq-d.FromSeq {
		mi.metrics.drop("malformed")
		mi.requestRepair(p, "malformed")
		return false
	}
	ev := d.Events[p.seq-d.FromSeq:]
	mi.scratch = mi.scratch[:0]
	for _, e := range ev {
		mi.scratch = append(mi.scratch, routing.Change{Hash: e.Hash, Added: e.Added})
	}
	if err := mi.idx.ApplyDelta(p.meta.NodeID, p.meta.Epoch, p.seq, d.ToSeq, mi.scratch); err != nil {
		mi.requestRepair(p, "index_"+errReason(err))
		return false
	}
	p.seq = d.ToSeq
	p.sum = applyChecksum(p.sum, ev)
	if p.want <= p.seq {
		p.want = 0
	}
	return true
}

// drainHeld applies the held deltas that have become contiguous and drops those already covered.
func (mi *SummaryMirror) drainHeld(p *peer) {
	progressed := false
	for len(p.held) > 0 && !p.needRepair {
		d := &p.held[0]
		switch {
		case d.ToSeq <= p.seq:
			mi.metrics.drop("duplicate")
		case d.FromSeq <= p.seq:
			if !mi.apply(p, d) {
				return
			}
			progressed = true
		default:
			if progressed {
				p.heldSince = mi.now() // a new gap starts now
			}
			return
		}
		p.held = p.held[1:]
	}
	if len(p.held) == 0 {
		p.held, p.heldSince = nil, time.Time{}
	}
}

func (mi *SummaryMirror) handleState(s *State) {
	p := mi.lookup(s.NodeID, s.Epoch)
	if p == nil {
		return
	}
	p.load, p.loadRecv = s.Load, mi.now()
	mi.compare(p, s.HeadSeq, s.Checksum, true)
}

// compare checks a node's (seq, checksum) report against the index. authoritative is true when
// the report comes from the node itself.
func (mi *SummaryMirror) compare(p *peer, seq, sum uint64, authoritative bool) {
	if !p.inIndex || p.repairing {
		return
	}
	// A report behind the index is stale (a state packet overtaken by a later delta): the
	// journal never goes back within an epoch, so there is nothing to compare.
	switch {
	case seq == p.seq && authoritative && sum != p.sum:
		mi.requestRepair(p, "checksum")
	case seq > p.seq && seq > p.want:
		if p.want <= p.seq {
			p.wantSince = mi.now()
		}
		p.want = seq
	}
}

func (mi *SummaryMirror) handleVector(v *Vector) {
	for _, e := range v.Entries {
		p := mi.peers[e.NodeID]
		if p == nil || p.meta.Epoch != e.Epoch {
			continue
		}
		mi.compare(p, e.Seq, e.Checksum, v.Role == RoleNode && v.From == e.NodeID)
	}
}

// tick turns timeouts into repairs: a gap held longer than ReorderWindow, a reported sequence
// not reached within LagTimeout, silence longer than SilenceTimeout.
func (mi *SummaryMirror) tick() bool {
	now := mi.now()
	for _, p := range mi.peers {
		if p.repairing || p.needRepair {
			continue
		}
		switch {
		case len(p.held) > 0 && now.Sub(p.heldSince) > mi.cfg.ReorderWindow:
			mi.requestRepair(p, "gap")
		case p.want > p.seq && now.Sub(p.wantSince) > mi.cfg.LagTimeout:
			mi.requestRepair(p, "behind")
		case now.Sub(p.lastHeard) > mi.cfg.SilenceTimeout:
			p.lastHeard = now
			mi.requestRepair(p, "silence")
		}
	}
	return false
}

func (mi *SummaryMirror) requestRepair(p *peer, reason string) {
	if p.needRepair || p.repairing {
		return
	}
	p.needRepair, p.reason = true, reason
}

// startRepairs launches pending repairs up to RepairConcurrency, each pulling a full summary.
func (mi *SummaryMirror) startRepairs(ctx context.Context, wg *sync.WaitGroup) {
	if ctx.Err() != nil {
		return
	}
	now := mi.now()
	for id, p := range mi.peers {
		if mi.inflight >= mi.cfg.RepairConcurrency {
			return
		}
		if !p.needRepair || p.repairing || now.Before(p.repairAfter) {
			continue
		}
		p.needRepair, p.repairing = false, true
		mi.inflight++
		mi.metrics.repairs.WithLabelValues(p.reason).Inc()
		meta, gen := p.meta, p.gen
		wg.Add(1)
		go func() {
			defer wg.Done()
			rctx, cancel := context.WithTimeout(ctx, mi.cfg.RepairTimeout)
			s, err := mi.fetch.FetchSummary(rctx, meta)
			cancel()
			select {
			case mi.results <- repairResult{node: id, gen: gen, sum: s, err: err}:
			case <-ctx.Done():
			}
		}()
	}
}

func (mi *SummaryMirror) finishRepair(r repairResult) {
	p := mi.peers[r.node]
	if p == nil || p.gen != r.gen {
		return // the node left or restarted meanwhile
	}
	p.repairing = false
	if r.err == nil && r.sum.Epoch != p.meta.Epoch {
		r.err = errEpochMoved
		mi.membershipChanged()
	}
	if r.err != nil {
		mi.metrics.repairFailures.Inc()
		p.failures++
		backoff := min(mi.cfg.RepairBackoff<<min(p.failures-1, 10), mi.cfg.MaxRepairBackoff)
		p.repairAfter = mi.now().Add(backoff)
		p.needRepair = true
		mi.cfg.Logger.Debug("summary repair failed", "node", r.node, "err", r.err, "retry_in", backoff)
		return
	}
	mi.idx.ReplaceNode(r.node, r.sum.Epoch, r.sum.Seq, r.sum.Hashes)
	p.inIndex, p.synced = true, true
	p.seq, p.sum = r.sum.Seq, SetChecksum(r.sum.Hashes)
	p.failures, p.repairAfter = 0, time.Time{}
	p.lastHeard = mi.now()
	if p.want <= p.seq {
		p.want = 0
	} else {
		p.wantSince = mi.now()
	}
	p.heldSince = mi.now()
	mi.drainHeld(p)
}

// reconcile makes the peer set equal to the node members memberlist has alive: a node that left
// or died is removed from the index at once; a new epoch drops the old summary and repairs.
func (mi *SummaryMirror) reconcile() {
	metas := mi.members()
	seen := make(map[string]bool, len(metas))
	for _, m := range metas {
		if m.Role != RoleNode {
			continue
		}
		seen[m.NodeID] = true
		p := mi.peers[m.NodeID]
		switch {
		case p == nil:
			mi.peers[m.NodeID] = &peer{meta: m, needRepair: true, reason: "join", lastHeard: mi.now()}
		case p.meta.Epoch != m.Epoch:
			// A restart: the old summary and the connection to the old process both go.
			mi.idx.RemoveNode(m.NodeID)
			mi.forget(m.NodeID)
			mi.peers[m.NodeID] = &peer{meta: m, needRepair: true, reason: "epoch", gen: p.gen + 1, lastHeard: mi.now()}
		default:
			if p.meta.GRPCAddr != m.GRPCAddr {
				mi.forget(m.NodeID) // the next repair dials the new address
			}
			p.meta = m
		}
	}
	for id, p := range mi.peers {
		if !seen[id] {
			mi.idx.RemoveNode(id)
			mi.forget(id)
			p.gen++ // orphan any running repair
			delete(mi.peers, id)
		}
	}
	mi.reconciled = true
}

// forget drops what the fetcher keeps for a node (its repair connection).
func (mi *SummaryMirror) forget(node string) {
	if f, ok := mi.fetch.(memberForgetter); ok {
		f.Forget(node)
	}
}

// publish stores a fresh immutable view for readers.
func (mi *SummaryMirror) publish() {
	v := &view{synced: mi.reconciled}
	v.nodes = make([]NodeStatus, 0, len(mi.peers))
	cold := 0
	for _, p := range mi.peers {
		if p.meta.Cold {
			cold++
		}
		v.nodes = append(v.nodes, NodeStatus{Meta: p.meta, Load: p.load, LoadRecv: p.loadRecv, Synced: p.synced, Seq: p.seq})
		if !p.synced {
			v.synced = false
		}
		if p.inIndex {
			v.vector = append(v.vector, VersionEntry{NodeID: p.meta.NodeID, Epoch: p.meta.Epoch, Seq: p.seq, Checksum: p.sum})
		}
	}
	slices.SortFunc(v.nodes, func(a, b NodeStatus) int { return cmpStr(a.Meta.NodeID, b.Meta.NodeID) })
	mi.view.Store(v)
	mi.metrics.nodes.Set(float64(len(v.nodes)))
	mi.metrics.coldNodes.Set(float64(cold))
}

// vector is the mirror's push/pull state.
func (mi *SummaryMirror) vector() []VersionEntry { return mi.view.Load().vector }

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func cmpStr(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
