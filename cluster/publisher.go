package cluster

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prefixmesh/prefixmesh/local"
)

// Source is the node's summary journal: *local.RadixTree.
type Source interface {
	SummarySince(since uint64, dst []local.SummaryEvent) ([]local.SummaryEvent, uint64, bool)
	SummarySnapshot(dst []uint64) ([]uint64, uint64)
}

var _ Source = (*local.RadixTree)(nil)

// LoadFunc reports the node's current load; At is filled in by the publisher when zero.
type LoadFunc func() Load

// publisher is a node's sending side: every PublishInterval it reads the journal since the last
// sequence it sent and sends the changes as deltas to every router; every LoadInterval it sends
// its state if load or head changed, and every HeartbeatInterval regardless.
type publisher struct {
	cfg     *Config
	epoch   *atomic.Uint64 // the agent's current epoch (Agent.SetEpoch moves it)
	src     Source
	load    LoadFunc
	send    func(b []byte) // to every router member, best effort
	metrics *metrics
	now     func() time.Time

	mu   sync.Mutex // guards head and sum: read by push/pull LocalState
	head uint64     // last sequence sent (or snapshotted)
	sum  uint64     // SetChecksum of the summary at head

	// Owned by run.
	events    []local.SummaryEvent
	wire      []Event
	buf       []byte
	lastLoad  Load
	lastState time.Time
	stateHead uint64
	stateEpo  uint64
}

func newPublisher(cfg *Config, epoch *atomic.Uint64, src Source, load LoadFunc, send func([]byte), m *metrics) *publisher {
	if load == nil {
		load = func() Load { return Load{} }
	}
	return &publisher{cfg: cfg, epoch: epoch, src: src, load: load, send: send, metrics: m, now: time.Now}
}

// version returns the (sequence, checksum) last published.
func (p *publisher) version() (uint64, uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.head, p.sum
}

// resync starts over from a full snapshot: at start, and when the journal no longer holds the
// sequence after the last one sent. Routers behind it see the later sequence in the next state
// or delta and repair over gRPC.
func (p *publisher) resync() {
	hashes, head := p.src.SummarySnapshot(nil)
	p.mu.Lock()
	p.head, p.sum = head, SetChecksum(hashes)
	p.mu.Unlock()
}

func (p *publisher) run(ctx context.Context) {
	p.resync()
	p.sendState()
	pub := time.NewTicker(p.cfg.PublishInterval)
	defer pub.Stop()
	ld := time.NewTicker(p.cfg.LoadInterval)
	defer ld.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-pub.C:
			p.publish()
		case <-ld.C:
			p.maybeSendState()
		}
	}
}

// publish sends the journal's changes since the last published sequence.
func (p *publisher) publish() {
	head, sum := p.version()
	var ok bool
	p.events, _, ok = p.src.SummarySince(head, p.events[:0])
	if !ok {
		p.resync()
		p.sendState()
		return
	}
	if len(p.events) == 0 {
		return
	}
	emit := p.now().UnixNano()
	epoch := p.epoch.Load()
	max := MaxDeltaEvents(len(p.cfg.Meta.NodeID))
	for start := 0; start < len(p.events); start += max {
		chunk := p.events[start:min(start+max, len(p.events))]
		p.wire = p.wire[:0]
		for _, e := range chunk {
			p.wire = append(p.wire, Event{Hash: e.Hash, Added: e.Added})
		}
		d := Delta{
			NodeID:   p.cfg.Meta.NodeID,
			Epoch:    epoch,
			FromSeq:  chunk[0].Seq - 1,
			ToSeq:    chunk[len(chunk)-1].Seq,
			EmitUnix: emit,
			Events:   p.wire,
		}
		b, err := d.AppendBinary(p.buf[:0])
		if err != nil {
			// Cannot happen for a validated config; resync rather than skip changes silently.
			p.cfg.Logger.Error("encode summary delta", "err", err)
			p.resync()
			return
		}
		p.buf = b
		p.send(b)
		sum = applyChecksum(sum, p.wire)
		p.mu.Lock()
		p.head, p.sum = d.ToSeq, sum
		p.mu.Unlock()
	}
}

// maybeSendState sends the state when load or head changed, or a heartbeat is due.
func (p *publisher) maybeSendState() {
	l := p.load()
	head, _ := p.version()
	if l.sameAs(p.lastLoad) && head == p.stateHead && p.epoch.Load() == p.stateEpo && p.now().Sub(p.lastState) < p.cfg.HeartbeatInterval {
		return
	}
	p.sendStateWith(l)
}

func (p *publisher) sendState() { p.sendStateWith(p.load()) }

func (p *publisher) sendStateWith(l Load) {
	now := p.now()
	if l.At == 0 {
		l.At = now.UnixNano()
	}
	head, sum := p.version()
	epoch := p.epoch.Load()
	s := State{NodeID: p.cfg.Meta.NodeID, Epoch: epoch, HeadSeq: head, Checksum: sum, Load: l}
	b, err := s.AppendBinary(p.buf[:0])
	if err != nil {
		p.cfg.Logger.Error("encode node state", "err", err)
		return
	}
	p.buf = b
	p.send(b)
	p.lastLoad, p.lastState, p.stateHead, p.stateEpo = l, now, head, epoch
}
