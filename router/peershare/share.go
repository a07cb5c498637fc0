// Package peershare makes router replicas route as one (routing/POLICIES.md, "Many routers"). A Sharer
// sits beside a router's routing.Decider: every decision the decider commits (gRPC Route or the
// HTTP front door) goes to the other routers as the part of the prompt's block-hash chain beyond
// what the chosen node's summary already reports (a few bytes for a cached prefix, up to
// routing.MaxShareChunks packets for a new one), and every ShareInterval, when its counts changed
// (and at least every Heartbeat), the router's in-flight load per node goes out as an absolute
// report, with the first tokens the router observed since the last tick (what its policy saw and
// how long each took). Received decisions enter the decider's overlay with its TTL, received
// loads its per-peer in-flight table and received first tokens its learned TTFT fits, so every
// router's overlay, load view and fits include the others' work; what a node caches still comes
// only from the node. Packets are best-effort memberlist messages
// (cluster.Agent's SendShare), encoded on the request path into pooled buffers and sent by one
// goroutine from a bounded queue; receipt copies, enqueues on a bounded queue and returns. Both
// queues drop and count when full: a lost decision costs what the node's summary will say a moment
// later, a lost load report one interval of staleness.
//
// The peers are the other routers. This package decides what to share and applies what arrives;
// the packets' wire format and their gossip transport are cluster's (cluster/sharewire.go), their
// sizes and packing rules routing's (routing/sharesize.go). The metrics keep the prefixmesh_share_
// prefix.
package peershare

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixmesh/prefixmesh/cluster"
	"github.com/prefixmesh/prefixmesh/routing"
)

// Transport carries share packets between routers: *cluster.Agent.
type Transport interface {
	SendShare(b []byte)
	SetShareHandler(h func(b []byte))
}

var _ Transport = (*cluster.Agent)(nil)

// Membership lists the live members (*cluster.Agent does). A Transport that implements it lets
// the sharer forget the load of a router that left at once, rather than after
// routing.DefaultPeerLoadTTL.
type Membership interface {
	Members() []cluster.Meta
}

var _ Membership = (*cluster.Agent)(nil)

// ErrConfig reports an unusable Config.
var ErrConfig = errors.New("peershare: invalid config")

// Config configures a Sharer.
type Config struct {
	// RouterID names this router in its packets (its gossip node id).
	RouterID string
	// Interval is how often the load report is checked and sent if it changed: 10 ms. In the
	// simulator (8 routers, Mooncake trace) 50 ms cost 2.5% of the hit ratio against one
	// router and 10 ms nothing, at about the same bytes, since a report only goes out when the
	// counts changed.
	Interval time.Duration
	// Heartbeat is the longest time between two load reports: 1 s, a third of
	// routing.DefaultPeerLoadTTL, so a router whose load stopped changing is not forgotten.
	Heartbeat time.Duration
	// QueueSize bounds the packets waiting to be sent and the packets received and not yet
	// applied: 4096 of at most 1,300 bytes each (~5 MiB), ~100 ms of a busy router's traffic.
	QueueSize int
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig(routerID string) Config {
	return Config{RouterID: routerID, Interval: 10 * time.Millisecond, Heartbeat: time.Second, QueueSize: 4096}
}

// Validate reports the first unusable field.
func (c Config) Validate() error {
	switch {
	case c.RouterID == "" || len(c.RouterID) > cluster.MaxNodeIDBytes:
		return fmt.Errorf("%w: router id of %d bytes", ErrConfig, len(c.RouterID))
	case c.Interval <= 0 || c.Heartbeat < c.Interval:
		return fmt.Errorf("%w: interval %v, heartbeat %v", ErrConfig, c.Interval, c.Heartbeat)
	case c.QueueSize <= 0:
		return fmt.Errorf("%w: queue size %d", ErrConfig, c.QueueSize)
	}
	return nil
}

// Sharer shares one router's decisions and load with the other routers and applies theirs.
type Sharer struct {
	cfg  Config
	dec  *routing.Decider
	tr   Transport
	now  func() time.Time
	m    *metrics
	bufs sync.Pool // *[]byte, packets on their way out

	out chan *[]byte
	in  chan []byte

	mu     sync.Mutex // guards chunks (the request path's scratch)
	chunks []routing.ShareChunk

	// decided is set when a decision was shared since the last load report: peers count a
	// shared decision as provisional load until the next report (routing.Decider.PeerDecision),
	// so one goes out at the next Interval even if the counts did not change (a gRPC Route
	// decision is never in flight).
	decided atomic.Bool

	members Membership // nil: peers are forgotten by the TTL only
	peerIDs []string   // sendLoop's scratch
	obs     []routing.TTFTObservation
	parts   []int

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// New builds a sharer for dec over tr and installs its hooks on dec and its handler on tr. It
// starts nothing; metrics go to reg (nil: none registered).
func New(cfg Config, dec *routing.Decider, tr Transport, reg prometheus.Registerer) (*Sharer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if dec == nil || tr == nil {
		return nil, fmt.Errorf("%w: a decider and a transport are required", ErrConfig)
	}
	m, err := newMetrics(reg, dec)
	if err != nil {
		return nil, fmt.Errorf("peershare: register metrics: %w", err)
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	s := &Sharer{cfg: cfg, dec: dec, tr: tr, now: now, m: m,
		out: make(chan *[]byte, cfg.QueueSize), in: make(chan []byte, cfg.QueueSize)}
	dec.SetHooks(routing.DeciderHooks{
		OnDecision: func(node string, hashes []uint64, indexed int, _ time.Time) { s.decision(node, hashes, indexed) },
	})
	dec.SetRouterID(cfg.RouterID)
	tr.SetShareHandler(s.receive)
	s.members, _ = tr.(Membership)
	return s, nil
}

// decision encodes a decision's new part into packets and queues them (the request path: no IO).
func (s *Sharer) decision(node string, hashes []uint64, indexed int) {
	if len(node) > cluster.MaxNodeIDBytes || indexed >= len(hashes) {
		return // the node already reports the whole chain: nothing only this router knows
	}
	s.decided.Store(true)
	s.mu.Lock()
	s.chunks = routing.AppendShareChunks(s.chunks[:0], s.cfg.RouterID, node, indexed, len(hashes))
	for _, c := range s.chunks {
		d := cluster.ShareDecision{RouterID: s.cfg.RouterID, NodeID: node, Offset: c.From, Hashes: hashes[c.From:c.To]}
		b := s.buf()
		var err error
		if *b, err = d.AppendBinary((*b)[:0]); err != nil {
			s.m.drops.WithLabelValues("encode").Inc()
			s.bufs.Put(b)
			continue
		}
		s.enqueue(b, "decision")
	}
	s.mu.Unlock()
}

func (s *Sharer) buf() *[]byte {
	b, _ := s.bufs.Get().(*[]byte)
	if b == nil {
		b = new([]byte)
		*b = make([]byte, 0, cluster.MaxPacketBytes)
	}
	return b
}

func (s *Sharer) enqueue(b *[]byte, kind string) {
	select {
	case s.out <- b:
		s.m.queued.WithLabelValues(kind).Inc()
	default:
		s.m.drops.WithLabelValues("send_queue_full").Inc()
		s.bufs.Put(b)
	}
}

// receive is the transport's handler: it keeps b (a copy) and never blocks.
func (s *Sharer) receive(b []byte) {
	select {
	case s.in <- b:
	default:
		s.m.drops.WithLabelValues("receive_queue_full").Inc()
	}
}

// Start runs the sender, the receiver and the load reporter until ctx ends or Close. It does not
// block.
func (s *Sharer) Start(ctx context.Context) {
	ctx, s.cancel = context.WithCancel(ctx)
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		s.sendLoop(ctx)
	}()
	go func() {
		defer s.wg.Done()
		s.receiveLoop(ctx)
	}()
}

// Close stops the loops and waits for them; packets still queued are dropped.
func (s *Sharer) Close() {
	if s.cancel != nil {
		s.cancel()
	}
	s.wg.Wait()
}

// sendLoop sends queued packets and, every Interval, the load report when it changed.
func (s *Sharer) sendLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	var loads, last []routing.NodeInFlight
	var parts []int
	var lastSent, lastPruned time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case b := <-s.out:
			s.send(*b, "decision")
			s.bufs.Put(b)
		case <-t.C:
			now := s.now()
			if now.Sub(lastPruned) >= s.cfg.Heartbeat {
				lastPruned = now
				s.forgetDeparted()
			}
			// Requests still queued keep being reported so the other routers keep expecting
			// their prefix as this router does (its overlay holds them until the first token).
			s.dec.RefreshPending(now, routing.DefaultOverlayTTL/2)
			s.sendTTFT()
			loads = s.dec.AppendOwnLoads(loads[:0])
			parts = routing.AppendLoadParts(parts[:0], s.cfg.RouterID, loads) // sorts loads
			if !s.decided.Swap(false) && equalLoads(loads, last) && now.Sub(lastSent) < s.cfg.Heartbeat {
				continue
			}
			last = append(last[:0], loads...)
			lastSent = now
			start := 0
			for p, end := range parts {
				l := cluster.ShareLoad{RouterID: s.cfg.RouterID, AtUnix: now.UnixNano(), Part: p, Parts: len(parts), Loads: loads[start:end]}
				s.sendNow(&l, "load")
				start = end
			}
		}
	}
}

// sendTTFT sends the first tokens observed since the last tick (sendLoop's goroutine).
func (s *Sharer) sendTTFT() {
	s.obs = s.dec.AppendTTFTObservations(s.obs[:0])
	s.parts = routing.AppendTTFTParts(s.parts[:0], s.cfg.RouterID, s.obs)
	start := 0
	for _, end := range s.parts {
		m := cluster.ShareTTFT{RouterID: s.cfg.RouterID, Obs: s.obs[start:end]}
		s.sendNow(&m, "ttft")
		start = end
	}
}

// sendNow encodes m into a pooled buffer and sends it (sendLoop's goroutine), counting a packet
// that does not encode.
func (s *Sharer) sendNow(m interface{ AppendBinary([]byte) ([]byte, error) }, kind string) {
	b := s.buf()
	var err error
	if *b, err = m.AppendBinary((*b)[:0]); err != nil {
		s.m.drops.WithLabelValues("encode").Inc()
	} else {
		s.send(*b, kind)
	}
	s.bufs.Put(b)
}

// forgetDeparted drops the load of every peer router that is no longer a member.
func (s *Sharer) forgetDeparted() {
	if s.members == nil {
		return
	}
	s.peerIDs = s.dec.PeerIDs(s.peerIDs[:0])
	if len(s.peerIDs) == 0 {
		return
	}
	ms := s.members.Members()
	for _, p := range s.peerIDs {
		if !slices.ContainsFunc(ms, func(m cluster.Meta) bool { return m.Role == cluster.RoleRouter && m.NodeID == p }) {
			s.dec.ForgetPeer(p)
			s.m.forgotten.Inc()
		}
	}
}

func equalLoads(a, b []routing.NodeInFlight) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func (s *Sharer) send(b []byte, kind string) {
	s.tr.SendShare(b)
	s.m.sent.WithLabelValues(kind).Inc()
	s.m.sentBytes.WithLabelValues(kind).Add(float64(len(b)))
}

// receiveLoop applies received packets to the decider.
func (s *Sharer) receiveLoop(ctx context.Context) {
	var d cluster.ShareDecision
	var l cluster.ShareLoad
	var tt cluster.ShareTTFT
	for {
		select {
		case <-ctx.Done():
			return
		case b := <-s.in:
			switch {
			case cluster.IsShareDecision(b):
				if err := d.UnmarshalBinary(b); err != nil {
					s.m.drops.WithLabelValues("decode").Inc()
					continue
				}
				if d.RouterID == s.cfg.RouterID {
					continue // our own, looped back
				}
				if !s.dec.PeerDecision(d.RouterID, d.NodeID, d.Offset, d.Hashes, s.now()) {
					s.m.drops.WithLabelValues("unknown_node").Inc()
					continue
				}
				s.m.received.WithLabelValues("decision").Inc()
			case cluster.IsShareLoad(b):
				if err := l.UnmarshalBinary(b); err != nil {
					s.m.drops.WithLabelValues("decode").Inc()
					continue
				}
				if l.RouterID == s.cfg.RouterID {
					continue
				}
				// Receipt time, not the sender's: router clocks are not trusted to agree.
				if !s.dec.SetPeerLoad(l.RouterID, l.Part, l.Parts, l.Loads, s.now()) {
					s.m.drops.WithLabelValues("peer_table_full").Inc()
					continue
				}
				s.m.received.WithLabelValues("load").Inc()
			case cluster.IsShareTTFT(b):
				if err := tt.UnmarshalBinary(b); err != nil {
					s.m.drops.WithLabelValues("decode").Inc()
					continue
				}
				if tt.RouterID == s.cfg.RouterID {
					continue
				}
				if used := s.dec.PeerTTFT(tt.Obs); used < len(tt.Obs) {
					s.m.ttftSkipped.Add(float64(len(tt.Obs) - used))
				}
				s.m.received.WithLabelValues("ttft").Inc()
			default:
				s.m.drops.WithLabelValues("decode").Inc()
			}
		}
	}
}
