package sim

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/prefixmesh/prefixmesh/local"
	"github.com/prefixmesh/prefixmesh/routing"
)

// Config is the simulated fleet and its network.
type Config struct {
	// Nodes is the fleet size. 8 is one inference server's worth of GPUs, each its own replica.
	Nodes int
	// BlockSize is tokens per KV block. 16 is vLLM's default.
	BlockSize int
	// BlocksPerNode is each node's KV pool. 32,768 blocks × 16 tokens is 512k tokens, about what
	// a 7–8B model with GQA keeps on an 80 GB GPU after its weights.
	BlocksPerNode int
	// PrefillTokensPerSec is the uncached prefill rate of a node; 10,000 tokens/s is the order
	// of a 7–13B model on one H100-class GPU.
	PrefillTokensPerSec float64
	// DecodeTokensPerSec is one sequence's decode rate; 50 tokens/s is a typical interactive
	// per-stream speed at moderate batch sizes.
	DecodeTokensPerSec float64
	// MaxConcurrent bounds the sequences a node runs at once (vLLM's max_num_seqs is 256; 64
	// keeps a node from hoarding a burst another node could serve sooner).
	MaxConcurrent int
	// Delay is how long a node's summary delta or load report takes to reach the router: one
	// gossip round (memberlist's default gossip interval is 200 ms on a LAN profile, 50 ms on
	// its local profile, which is what a rack of GPU nodes is).
	Delay time.Duration
	// Loss is the probability that one summary delta is lost; the router notices the gap at the
	// next delta and repairs with a full snapshot after RepairDelay.
	Loss float64
	// RepairDelay is the time a repair pull takes (one gRPC round trip plus the stream).
	RepairDelay time.Duration
	// OverlayTTL is how long the router trusts its own record of where it just sent a prefix
	// (routing.DefaultOverlayTTL, as the daemon).
	OverlayTTL time.Duration
	// OverlayMax bounds the overlay's (hash, node) pairs (routing.DefaultOverlayMaxEntries).
	OverlayMax int
	// Seed drives the loss process (the only randomness in a run).
	Seed uint64
	// Policy configures the routing policies.
	Policy routing.PolicyConfig
	// Progress, if set, is called after each arrival with the number routed so far and the
	// total; returning false stops the run with ErrStopped.
	Progress func(done, total int) bool
}

// DefaultConfig is the standard configuration (see each field).
func DefaultConfig() Config {
	return Config{
		Nodes:               8,
		BlockSize:           16,
		BlocksPerNode:       32768,
		PrefillTokensPerSec: 10000,
		DecodeTokensPerSec:  50,
		MaxConcurrent:       64,
		Delay:               50 * time.Millisecond,
		RepairDelay:         20 * time.Millisecond,
		OverlayTTL:          routing.DefaultOverlayTTL,
		OverlayMax:          routing.DefaultOverlayMaxEntries,
		Policy:              routing.DefaultPolicyConfig(),
	}
}

// Errors of the package.
var (
	// ErrConfig is returned, wrapped, for an unusable Config.
	ErrConfig = errors.New("sim: invalid config")
	// ErrStopped: Config.Progress asked the run to stop.
	ErrStopped = errors.New("sim: stopped")
)

// Validate reports whether c is usable.
func (c Config) Validate() error {
	switch {
	case c.Nodes <= 0 || c.Nodes > 1024:
		return fmt.Errorf("%w: nodes %d outside 1..1024", ErrConfig, c.Nodes)
	case c.BlockSize <= 0 || c.BlocksPerNode <= 0:
		return fmt.Errorf("%w: block size %d, blocks %d must be positive", ErrConfig, c.BlockSize, c.BlocksPerNode)
	case !(c.PrefillTokensPerSec > 0) || !(c.DecodeTokensPerSec > 0):
		return fmt.Errorf("%w: rates must be positive", ErrConfig)
	case c.MaxConcurrent <= 0:
		return fmt.Errorf("%w: max concurrent %d must be positive", ErrConfig, c.MaxConcurrent)
	case c.Delay < 0 || c.RepairDelay < 0 || c.OverlayTTL < 0:
		return fmt.Errorf("%w: negative delay", ErrConfig)
	case !(c.Loss >= 0 && c.Loss < 1):
		return fmt.Errorf("%w: loss %v outside [0,1)", ErrConfig, c.Loss)
	}
	return c.Policy.Validate()
}

// epoch0 anchors the virtual clock for code that wants a time.Time (policies, overlay). Any
// fixed instant works; a fixed one keeps runs reproducible.
var epoch0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// view is the router's knowledge of one node.
type view struct {
	rep             load // last load report received
	inFlight        int  // this router's requests not yet finished
	inFlightPrefill int  // their estimated uncached tokens, until first token
	peak            int
	repairing       bool
}

// reqState is a request's journey.
type reqState struct {
	node, estimate, estUncached int
	hashes                      []uint64 // held in the overlay as pending from routing to first token
}

// message is a delta or a load report on its way to the router.
type message struct {
	node     int
	from, to uint64
	changes  []routing.Change
	full     bool // a full summary in snapshot (the journal overflowed), not a delta
	snapshot []uint64
	load     load
}

// Sim is one policy's run over a trace. It is single-threaded and deterministic.
type Sim struct {
	cfg     Config
	trace   *Trace
	policy  routing.Policy
	index   *routing.Index
	overlay *routing.Overlay
	nodes   []*node
	views   []view
	reqs    []reqState
	q       eventQueue
	msgs    []message
	freeMsg []int
	rng     *rand.Rand
	col     collector
	repairs int // full-summary pulls after a gap

	// scratch reused across arrivals
	hashes  []uint64
	ids     []string
	infos   []routing.NodeInfo
	blocks  []int
	expired time.Duration // when the overlay was last expired
	matched []int
	dec     routing.Decision
	events  []local.SummaryEvent
}

// Run replays trace through the named policy and returns its metrics.
func Run(trace *Trace, policy string, cfg Config) (Result, error) {
	s, err := New(trace, policy, cfg)
	if err != nil {
		return Result{}, err
	}
	return s.Run()
}

// New builds a run of the named policy (routing.NewPolicy with cfg.Policy) without starting it.
func New(trace *Trace, policy string, cfg Config) (*Sim, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p, err := routing.NewPolicy(policy, cfg.Policy)
	if err != nil {
		return nil, err
	}
	return NewWithPolicy(trace, p, cfg)
}

// NewWithPolicy builds a run of any routing.Policy, for trying a policy before it joins
// routing.PolicyNames. The policy must not be shared with a concurrent run.
func NewWithPolicy(trace *Trace, p routing.Policy, cfg Config) (*Sim, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Sim{
		cfg:     cfg,
		trace:   trace,
		policy:  p,
		index:   routing.NewIndex(routing.DefaultIndexConfig()),
		overlay: routing.NewOverlay(cfg.OverlayTTL, cfg.OverlayMax),
		views:   make([]view, cfg.Nodes),
		reqs:    make([]reqState, len(trace.Requests)),
		rng:     rand.New(rand.NewPCG(cfg.Seed, 0x1055)),
	}
	for i := 0; i < cfg.Nodes; i++ {
		n, err := newNode(i, &cfg)
		if err != nil {
			return nil, err
		}
		s.nodes = append(s.nodes, n)
		s.ids = append(s.ids, n.id)
		// At join the router knows each node is empty and idle, and its capacity (metadata).
		s.index.ReplaceNode(n.id, n.epoch, 0, nil)
		s.views[i].rep = n.load(0)
	}
	for r := range trace.Requests {
		s.q.schedule(event{at: trace.Requests[r].Arrival, kind: evArrive, req: r})
	}
	return s, nil
}

// Run executes every event and returns the metrics.
func (s *Sim) Run() (Result, error) {
	routed := 0
	for {
		e, ok := s.q.next()
		if !ok {
			break
		}
		switch e.kind {
		case evArrive:
			if err := s.route(e.req); err != nil {
				return Result{}, err
			}
			routed++
			if s.cfg.Progress != nil && !s.cfg.Progress(routed, len(s.trace.Requests)) {
				return Result{}, ErrStopped
			}
		case evPrefillDone:
			n := s.nodes[e.node]
			req := &s.trace.Requests[e.req]
			s.col.ttft = append(s.col.ttft, seconds(s.q.now-req.Arrival))
			s.views[e.node].inFlightPrefill -= s.reqs[e.req].estUncached
			s.overlay.End(s.ids[e.node], s.reqs[e.req].hashes, epoch0.Add(s.q.now))
			s.reqs[e.req].hashes = nil
			n.finishPrefill(s, e.req)
			n.tryStart(s)
			s.changed(n)
		case evFinish:
			n := s.nodes[e.node]
			s.col.e2e = append(s.col.e2e, seconds(s.q.now-s.trace.Requests[e.req].Arrival))
			n.finish(e.req)
			s.views[e.node].inFlight--
			n.tryStart(s)
			s.changed(n)
		case evDelta:
			s.deliverDelta(e.msg)
		case evRepair:
			s.repair(e.node)
		case evLoad:
			s.deliverLoad(e.msg)
		}
	}
	prefill := make([]float64, len(s.nodes))
	peak := make([]float64, len(s.nodes))
	for i, n := range s.nodes {
		prefill[i] = float64(n.prefillDone)
		peak[i] = float64(s.views[i].peak)
	}
	return s.col.result(s.policy.Name(), prefill, peak), nil
}

// route chooses a node for request r and hands the request to it.
func (s *Sim) route(r int) error {
	req := &s.trace.Requests[r]
	bs := s.cfg.BlockSize
	now := epoch0.Add(s.q.now)
	s.hashes = local.AppendBlockHashes(s.hashes[:0], req.Tokens, bs, 0)
	k := len(s.nodes)
	s.blocks, s.matched = grow(s.blocks, k), grow(s.matched, k)
	s.index.Estimate(s.hashes, s.ids, s.blocks)
	if s.q.now-s.expired >= s.cfg.OverlayTTL/2 { // as the daemon does, every TTL/2
		s.overlay.Expire(now)
		s.expired = s.q.now
	}
	s.overlay.Estimate(s.hashes, s.ids, s.blocks, now) // raises to max(index, overlay)
	s.infos = s.infos[:0]
	for i, n := range s.nodes {
		s.matched[i] = s.blocks[i] * bs
		v := &s.views[i]
		s.infos = append(s.infos, routing.NodeInfo{
			ID: n.id, Alive: true, PrefillTokensPerSec: s.cfg.PrefillTokensPerSec,
			QueuedPrefillTokens: v.rep.queued, Running: v.rep.running, Waiting: v.rep.waiting,
			FreeBlocks: v.rep.freeBlocks, CapacityBlocks: v.rep.capacityBlock,
			LoadAge: s.q.now - v.rep.at, InFlight: v.inFlight, InFlightPrefillTokens: v.inFlightPrefill,
			BlockSize: bs,
		})
	}
	rq := routing.Request{Hashes: s.hashes, PromptTokens: len(req.Tokens), SessionKey: req.SessionKey, BlockSize: bs}
	if err := s.policy.Choose(&rq, s.infos, s.matched, now, &s.dec); err != nil {
		return fmt.Errorf("route request %d: %w", r, err)
	}
	i := s.dec.Node
	if i < 0 || i >= k {
		return fmt.Errorf("route request %d: policy %s chose node %d of %d", r, s.policy.Name(), i, k)
	}
	st := &s.reqs[r]
	// Pending until the first token, as the daemon does: a request queued longer than the
	// overlay TTL must not hide its prefix from the router.
	st.hashes = append(st.hashes[:0], s.hashes...)
	s.overlay.Begin(s.ids[i], st.hashes, now)
	st.node, st.estimate = i, s.matched[i]
	st.estUncached = max(0, len(req.Tokens)-st.estimate)
	v := &s.views[i]
	v.inFlight++
	v.inFlightPrefill += st.estUncached
	v.peak = max(v.peak, v.inFlight)
	n := s.nodes[i]
	n.enqueue(s, r)
	n.tryStart(s)
	s.changed(n)
	return nil
}

// admitted records the node's actual match at admission, for hit ratio and estimate accuracy.
func (s *Sim) admitted(r, matched int) {
	s.col.promptTokens += int64(len(s.trace.Requests[r].Tokens))
	s.col.matchedTokens += int64(matched)
	s.col.estimate(s.reqs[r].estimate, matched)
}

// reject drops a request no node can ever hold.
func (s *Sim) reject(n *node, r int) {
	s.col.rejected++
	v := &s.views[n.idx]
	v.inFlight--
	v.inFlightPrefill -= s.reqs[r].estUncached
	s.overlay.Abort(s.ids[n.idx], s.reqs[r].hashes)
	s.reqs[r].hashes = nil
}

// changed publishes what changed on n: its summary delta (or a snapshot when the journal
// overflowed) and its load, both reaching the router after Delay.
func (s *Sim) changed(n *node) {
	ni := n.idx
	at := s.q.now + s.cfg.Delay
	var head uint64
	var ok bool
	s.events, head, ok = n.tree.SummarySince(n.published, s.events[:0])
	switch {
	case !ok:
		m := s.newMessage(ni)
		msg := &s.msgs[m]
		msg.snapshot, head = n.tree.SummarySnapshot(msg.snapshot[:0])
		msg.full, msg.to = true, head
		s.q.schedule(event{at: at, kind: evDelta, msg: m})
	case len(s.events) > 0:
		if s.cfg.Loss > 0 && s.rng.Float64() < s.cfg.Loss {
			break // lost on the wire
		}
		m := s.newMessage(ni)
		msg := &s.msgs[m]
		msg.from, msg.to = n.published, head
		for _, e := range s.events {
			msg.changes = append(msg.changes, routing.Change{Hash: e.Hash, Added: e.Added})
		}
		s.q.schedule(event{at: at, kind: evDelta, msg: m})
	}
	n.published = head
	m := s.newMessage(ni)
	s.msgs[m].load = n.load(s.q.now)
	s.msgs[m].load.head = head
	s.q.schedule(event{at: at, kind: evLoad, msg: m})
}

// deliverDelta applies a delta (or snapshot) at the router; a gap starts a repair.
func (s *Sim) deliverDelta(mi int) {
	m := &s.msgs[mi]
	n := s.nodes[m.node]
	if m.full {
		s.index.ReplaceNode(n.id, n.epoch, m.to, m.snapshot)
	} else if err := s.index.ApplyDelta(n.id, n.epoch, m.from, m.to, m.changes); err != nil {
		s.startRepair(m.node) // ErrGap: a delta was lost
	}
	s.freeMessage(mi)
}

// deliverLoad installs a load report. The report also carries the node's summary head, so a
// router whose index is behind it with no delta left in flight (the last delta was lost: deltas
// travel ahead of the report that follows them) repairs without waiting for the next delta.
func (s *Sim) deliverLoad(mi int) {
	m := &s.msgs[mi]
	v := &s.views[m.node]
	if m.load.at >= v.rep.at {
		v.rep = m.load
	}
	if _, seq, _, _ := s.index.NodeState(s.nodes[m.node].id); seq < m.load.head {
		s.startRepair(m.node)
	}
	s.freeMessage(mi)
}

// startRepair schedules a full-summary pull from node ni unless one is under way.
func (s *Sim) startRepair(ni int) {
	if v := &s.views[ni]; !v.repairing {
		v.repairing = true
		s.q.schedule(event{at: s.q.now + s.cfg.RepairDelay, kind: evRepair, node: ni})
	}
}

// repair pulls node ni's full summary (NodeCache.GetSummary) and installs it.
func (s *Sim) repair(ni int) {
	n := s.nodes[ni]
	hashes, head := n.tree.SummarySnapshot(nil)
	s.index.ReplaceNode(n.id, n.epoch, head, hashes)
	s.views[ni].repairing = false
	s.repairs++
}

func (s *Sim) newMessage(node int) int {
	if k := len(s.freeMsg); k > 0 {
		i := s.freeMsg[k-1]
		s.freeMsg = s.freeMsg[:k-1]
		s.msgs[i].node = node
		return i
	}
	s.msgs = append(s.msgs, message{node: node})
	return len(s.msgs) - 1
}

// freeMessage recycles a delivered message, keeping its slices' capacity.
func (s *Sim) freeMessage(i int) {
	m := &s.msgs[i]
	*m = message{changes: m.changes[:0], snapshot: m.snapshot[:0]}
	s.freeMsg = append(s.freeMsg, i)
}

func grow(b []int, n int) []int {
	if cap(b) < n {
		return make([]int, n)
	}
	return b[:n]
}
