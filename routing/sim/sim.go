package sim

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/prefixmesh/prefixmesh/local"
	"github.com/prefixmesh/prefixmesh/local/kvpool"
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
	// CPUBlocks is each node's CPU KV tier in GPU-sized blocks, as vLLM's OffloadingConnector
	// keeps one in host memory (kvpool.CPUTier, the simulated engine's tier): 0, off. When set,
	// the chunks the GPU evicts spill into it (LRU), the blocks it holds right after a request's
	// GPU prefix are loaded at CPULoadTokensPerSec instead of prefilled, and the node's summary
	// carries them under their tier keys. At most kvpool.MaxBlocks, a multiple of
	// CPUChunkBlocks.
	CPUBlocks int
	// CPUChunkBlocks is how many GPU blocks make one CPU block, spilled, loaded and evicted
	// whole: 1, vLLM's default (vllm/v1/kv_offload/spec.py: the offloaded block_size defaults to
	// the GPU block size).
	CPUChunkBlocks int
	// CPULoadTokensPerSec is the rate at which CPU-held tokens load back into the GPU:
	// 150,000 tokens/s, 15× the prefill rate, the simulated engine's default (vLLM's
	// KV-offloading blog, 2026-01-08: ~50 GB/s GPU↔CPU on an H100 against ~128 KiB of KV a
	// token for an 8B model, ≈2.6 µs a token against ≈40 µs to prefill one). Node speeds do not
	// scale it.
	CPULoadTokensPerSec float64
	// PrefillTokensPerSec is the uncached prefill rate of a node; 10,000 tokens/s is the order
	// of a 7–13B model on one H100-class GPU.
	PrefillTokensPerSec float64
	// NodeSpeeds, when set, scales node i's prefill and decode rates by NodeSpeeds[i mod
	// len]: a fleet of mixed GPUs, or nodes slowed by a noisy neighbour. The routers are not
	// told; they learn each node's speed from its first tokens (routing.TTFTFit).
	NodeSpeeds []float64
	// DecodeTokensPerSec is one sequence's decode rate; 50 tokens/s is a typical interactive
	// per-stream speed at moderate batch sizes.
	DecodeTokensPerSec float64
	// MaxConcurrent bounds the sequences a node runs at once (vLLM's max_num_seqs is 256; 64
	// keeps a node from hoarding a burst another node could serve sooner).
	MaxConcurrent int
	// TokenBudget is the most tokens one engine step schedules, decode sequences' tokens
	// included (vLLM's max_num_batched_tokens; kvpool.DefaultTokenBudget, 8192, when 0). Each
	// node runs kvpool.FromCosts of its prefill and decode rates with it: a step takes
	// 1/DecodeTokensPerSec − 16/PrefillTokensPerSec plus 1/PrefillTokensPerSec per token it
	// carries, so prompt chunks slow the decode sequences sharing their steps.
	TokenBudget int

	// PrefillNodes makes the fleet disaggregated: nodes 0..PrefillNodes−1 run prefill legs only
	// (routing.RolePrefill), the others decode (routing.RoleDecode). 0: every node serves whole
	// requests (routing.RoleBoth).
	PrefillNodes int
	// Disaggregate is when a request's prefill runs on a prefill node (with PrefillNodes > 0):
	// the router's own rule (auto, always, never: routing.Decider.PlanPrefill) or a baseline's
	// (llmd: routing.PlanPrefillLLMD with LLMDNonCachedTokens; dynamo: routing.PlanPrefillDynamo
	// with the policy's Dynamo tier weights).
	Disaggregate Disagg
	// LLMDNonCachedTokens is llm-d's nonCachedTokens: disaggregate when at least this many prompt
	// tokens are not on the decode node's GPU. 512, the value of llm-d's README example
	// (llm-d/llm-d-inference-scheduler, the prefix-based P/D decider; its default, 0, disables
	// P/D).
	LLMDNonCachedTokens int
	// KVTransferTokensPerSec and KVTransferOverhead are the ground truth of moving a prompt's KV
	// from a prefill node to a decode node: overhead + tokens / rate, each transfer on its own.
	// 100,000 tokens/s is 128 KiB of KV a token (an 8B model with GQA in bf16) at 12.5 GB/s, one
	// 100 Gb/s NIC; 10 ms sets a transfer up (the side-channel handshake and the read's
	// registration). The routers are not told: they learn it from what they observe
	// (routing.Decider.ObserveTransfer: the prefill leg's answer to the decode leg's first token).
	KVTransferTokensPerSec float64
	KVTransferOverhead     time.Duration
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
	// LoadInterval is how often a node sends its load report (cluster.Config.LoadInterval: the
	// daemons' 200 ms), each arriving Delay later; between reports a router sees the last one,
	// aged. 0 sends one after every change (an idealised, always-fresh view).
	LoadInterval time.Duration

	// Routers is the number of router replicas (1..64). Clients spread over them round-robin,
	// or by session where the trace has one (a session's requests reach one router); each
	// router has its own index, overlay, in-flight counts and view, and every node's deltas and
	// load reports reach each router independently (each with the delay and loss above).
	Routers int
	// Sharing makes routers tell each other their decisions and in-flight load (routing.Decider
	// peers, routing/POLICIES.md, "Many routers") with ShareDelay and ShareLoss; off, each router sees only its own.
	Sharing bool
	// ShareDelay is a router-to-router message's latency: 1 ms, one memberlist best-effort UDP
	// datagram on a LAN (a few hundred µs) plus the sender's and receiver's queues — well under
	// the node→router Delay, which includes the node's journal poll. It is the one knob the
	// gap to a single router is sensitive to (requests reaching different routers within it
	// cannot see each other): on the Mooncake trace at 8 routers, p99 TTFT is 1.01× one
	// router's at 0, 1.05× at 1 ms and 1.06× at 5 ms.
	ShareDelay time.Duration
	// ShareLoss is the probability that one router-to-router packet is lost.
	ShareLoss float64
	// ShareInterval is how often a router sends its load report while it changes, and at least
	// every second (router/peershare's default, 10 ms: on the Mooncake trace at 8 routers, 50 ms
	// cost 2.5% of the hit ratio and 2% of mean TTFT against one router, 10 ms nothing, at about
	// the same bytes — a report goes out only when the counts changed, so the cost follows the
	// request rate, not the interval).
	ShareInterval time.Duration
	// NoAdmissionDelay turns off the routers' stagger of bursts (routing.Decider.AdmissionWait),
	// to measure what it does; off, a router decides the instant a request arrives.
	NoAdmissionDelay bool
	// AdmissionSlot is the stagger's wait per router ahead (routing.DeciderConfig.AdmissionSlot;
	// 0: routing.DefaultAdmissionSlot).
	AdmissionSlot time.Duration
	// NoTTFTLearning keeps the routers from learning each node's TTFT from its first tokens
	// (routing.DeciderConfig.NoTTFTLearning).
	NoTTFTLearning bool
	// Spread lets prefixmesh spread requests over the nodes a burst would fill
	// (routing.DeciderConfig.Spread; off by default).
	Spread bool

	// Seed drives the loss processes (the only randomness in a run).
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
		Nodes:                  8,
		BlockSize:              16,
		BlocksPerNode:          32768,
		CPUChunkBlocks:         1,
		CPULoadTokensPerSec:    150000,
		PrefillTokensPerSec:    10000,
		DecodeTokensPerSec:     50,
		MaxConcurrent:          64,
		TokenBudget:            kvpool.DefaultTokenBudget,
		Disaggregate:           DisaggAuto,
		LLMDNonCachedTokens:    512,
		KVTransferTokensPerSec: 100000,
		KVTransferOverhead:     10 * time.Millisecond,
		Delay:                  50 * time.Millisecond,
		RepairDelay:            20 * time.Millisecond,
		OverlayTTL:             routing.DefaultOverlayTTL,
		OverlayMax:             routing.DefaultOverlayMaxEntries,
		LoadInterval:           200 * time.Millisecond,
		Routers:                1,
		Sharing:                true,
		ShareDelay:             time.Millisecond,
		ShareInterval:          10 * time.Millisecond,
		Policy:                 routing.DefaultPolicyConfig(),
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
	case slices.ContainsFunc(c.NodeSpeeds, func(v float64) bool { return !(v > 0) || math.IsInf(v, 1) }):
		return fmt.Errorf("%w: node speeds %v must be positive", ErrConfig, c.NodeSpeeds)
	case c.CPUBlocks < 0 || c.CPUBlocks > kvpool.MaxBlocks:
		return fmt.Errorf("%w: CPU blocks %d outside 0..%d", ErrConfig, c.CPUBlocks, kvpool.MaxBlocks)
	case c.CPUBlocks > 0 && (c.CPUChunkBlocks <= 0 || c.CPUBlocks%c.CPUChunkBlocks != 0):
		return fmt.Errorf("%w: CPU blocks %d must be a multiple of a positive chunk (%d blocks): the tier holds whole chunks", ErrConfig, c.CPUBlocks, c.CPUChunkBlocks)
	case c.CPUBlocks > 0 && (!(c.CPULoadTokensPerSec > 0) || math.IsInf(c.CPULoadTokensPerSec, 1)):
		return fmt.Errorf("%w: CPU load rate %v must be positive and finite", ErrConfig, c.CPULoadTokensPerSec)
	case c.MaxConcurrent <= 0:
		return fmt.Errorf("%w: max concurrent %d must be positive", ErrConfig, c.MaxConcurrent)
	case c.TokenBudget < 0:
		return fmt.Errorf("%w: token budget %d must not be negative", ErrConfig, c.TokenBudget)
	case c.PrefillNodes < 0 || c.PrefillNodes > 0 && c.PrefillNodes >= c.Nodes:
		return fmt.Errorf("%w: prefill nodes %d: want 0, or fewer than the %d nodes (some must decode)", ErrConfig, c.PrefillNodes, c.Nodes)
	case !c.Disaggregate.valid():
		return fmt.Errorf("%w: disaggregate %q: want auto, always, never, llmd or dynamo", ErrConfig, c.Disaggregate)
	case c.LLMDNonCachedTokens < 0:
		return fmt.Errorf("%w: llm-d non-cached tokens %d must not be negative", ErrConfig, c.LLMDNonCachedTokens)
	case c.PrefillNodes > 0 && (!(c.KVTransferTokensPerSec > 0) || math.IsInf(c.KVTransferTokensPerSec, 1) || c.KVTransferOverhead < 0):
		return fmt.Errorf("%w: KV transfer rate %v must be positive and finite, overhead %v not negative", ErrConfig, c.KVTransferTokensPerSec, c.KVTransferOverhead)
	case c.Delay < 0 || c.RepairDelay < 0 || c.OverlayTTL < 0:
		return fmt.Errorf("%w: negative delay", ErrConfig)
	case !(c.Loss >= 0 && c.Loss < 1) || !(c.ShareLoss >= 0 && c.ShareLoss < 1):
		return fmt.Errorf("%w: loss %v, share loss %v outside [0,1)", ErrConfig, c.Loss, c.ShareLoss)
	case c.Routers <= 0 || c.Routers > 64:
		return fmt.Errorf("%w: routers %d outside 1..64", ErrConfig, c.Routers)
	case c.LoadInterval < 0 || c.ShareDelay < 0 || c.ShareInterval < 0 || (c.Sharing && c.Routers > 1 && c.ShareInterval == 0):
		return fmt.Errorf("%w: negative interval, or sharing without a share interval", ErrConfig)
	}
	return c.Policy.Validate()
}

// epoch0 anchors the virtual clock for code that wants a time.Time (policies, overlay). Any
// fixed instant works; a fixed one keeps runs reproducible.
var epoch0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// reqState is a request's journey.
type reqState struct {
	router, node, estimate int
	ticket                 *routing.Ticket // the router's in-flight record, until the request ends

	// Disaggregated (pnode >= 0): the prefill node, its leg's ticket until it answers, when it
	// answered, and the router's plan (the tokens it expects the decode node to pull and the
	// decode node's predicted wait, which ObserveTransfer takes out of what it observes).
	pnode    int
	pticket  *routing.Ticket
	answered time.Duration
	plan     routing.PrefillPlan
}

// message is something on the wire: a node's delta, snapshot or load report to the routers, or
// a router's decision or load report to the other routers. One message may be delivered to
// several routers; refs counts the deliveries still pending.
type message struct {
	node     int
	from, to uint64
	changes  []routing.Change
	full     bool // a full summary in snapshot (the journal overflowed), not a delta
	snapshot []uint64
	load     load
	refs     int

	peer        int // sending router (shares)
	hashes      []uint64
	offset      int // of hashes[0] in the request's chain
	loads       []routing.NodeInFlight
	part, parts int
	ttft        []routing.TTFTObservation
}

// Sim is one policy's run over a trace. It is single-threaded and deterministic.
type Sim struct {
	cfg     Config
	trace   *Trace
	name    string
	nodes   []*node
	byID    map[string]int
	routers []*router
	reqs    []reqState
	q       eventQueue
	msgs    []message
	freeMsg []int
	rng     *rand.Rand
	col     collector

	inFlight, peak []int // per node: requests routed there and not finished (the truth)
	rr             int   // round-robin position over routers
	ended          int   // requests served or rejected

	remote int // requests prefilled on a prefill node

	nodeBytes, shareBytes int64 // bytes sent node → routers and router → routers
	shareMsgs, shareLost  int64

	// scratch reused across arrivals
	events []local.SummaryEvent
	chunks []routing.ShareChunk
	parts  []int
}

// Run replays trace through the named policy and returns its metrics.
func Run(trace *Trace, policy string, cfg Config) (Result, error) {
	s, err := New(trace, policy, cfg)
	if err != nil {
		return Result{}, err
	}
	return s.Run()
}

// New builds a run of the named policy (routing.NewPolicy with cfg.Policy, one instance per
// router, as each router process has its own) without starting it.
func New(trace *Trace, policy string, cfg Config) (*Sim, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if _, err := routing.NewPolicy(policy, cfg.Policy); err != nil {
		return nil, err
	}
	return newSim(trace, cfg, func() routing.Policy {
		p, _ := routing.NewPolicy(policy, cfg.Policy) // validated above
		return p
	})
}

// NewWithPolicy builds a run of any routing.Policy, for trying a policy before it joins
// routing.PolicyNames. With several routers they all use p (its state, if any, is shared). The
// policy must not be shared with a concurrent run.
func NewWithPolicy(trace *Trace, p routing.Policy, cfg Config) (*Sim, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return newSim(trace, cfg, func() routing.Policy { return p })
}

func newSim(trace *Trace, cfg Config, policy func() routing.Policy) (*Sim, error) {
	s := &Sim{
		cfg:      cfg,
		trace:    trace,
		byID:     make(map[string]int),
		reqs:     make([]reqState, len(trace.Requests)),
		rng:      rand.New(rand.NewPCG(cfg.Seed, 0x1055)),
		inFlight: make([]int, cfg.Nodes),
		peak:     make([]int, cfg.Nodes),
	}
	for i := range s.reqs {
		s.reqs[i].pnode = -1
	}
	for i := 0; i < cfg.Nodes; i++ {
		n, err := newNode(i, &cfg)
		if err != nil {
			return nil, err
		}
		s.nodes = append(s.nodes, n)
		s.byID[n.id] = i
	}
	for r := 0; r < cfg.Routers; r++ {
		rt, err := newRouter(s, r, policy())
		if err != nil {
			return nil, err
		}
		s.routers = append(s.routers, rt)
	}
	s.name = s.routers[0].dec.Policy().Name()
	for r := range trace.Requests {
		s.q.schedule(event{at: trace.Requests[r].Arrival, kind: evArrive, req: r})
	}
	if cfg.LoadInterval > 0 {
		for i := range s.nodes {
			s.q.schedule(event{at: cfg.LoadInterval, kind: evLoadTick, node: i})
		}
	}
	if s.sharing() {
		for r := range s.routers {
			s.q.schedule(event{at: cfg.ShareInterval, kind: evShareTick, router: r})
		}
	}
	return s, nil
}

func (s *Sim) sharing() bool { return s.cfg.Sharing && s.cfg.Routers > 1 }

// running reports whether requests remain: periodic ticks stop once every request has ended.
func (s *Sim) running() bool { return s.ended < len(s.trace.Requests) }

// Run executes every event and returns the metrics.
func (s *Sim) Run() (Result, error) {
	routed := 0
	for {
		e, ok := s.q.next()
		if !ok {
			break
		}
		now := epoch0.Add(s.q.now)
		switch e.kind {
		case evArrive, evDecide:
			if e.kind == evArrive {
				if w := s.admit(e.req); w > 0 { // the router staggers a burst (Decider.AdmissionWait)
					s.col.staggered++
					s.col.staggerWait += w
					s.q.schedule(event{at: s.q.now + w, kind: evDecide, req: e.req})
					continue
				}
			}
			if err := s.route(e.req); err != nil {
				return Result{}, err
			}
			routed++
			if s.cfg.Progress != nil && !s.cfg.Progress(routed, len(s.trace.Requests)) {
				return Result{}, ErrStopped
			}
		case evStep:
			s.nodes[e.node].endStep(s)
		case evKVReady:
			n := s.nodes[e.node]
			if st := &s.reqs[e.req]; st.pnode >= 0 && st.node == e.node { // a decode leg's pull is done
				p := s.nodes[st.pnode]
				p.endLease(e.req)
				s.changed(p)
			}
			n.kvReady(s, e.req)
			s.changed(n)
		case evDelta:
			s.routers[e.router].deliverDelta(s, e.msg)
			s.release(e.msg)
		case evRepair:
			s.routers[e.router].repair(s, e.node)
		case evLoad:
			s.routers[e.router].deliverLoad(s, e.msg)
			s.release(e.msg)
		case evLoadTick:
			s.loadTick(s.nodes[e.node])
		case evShareDecision:
			m := &s.msgs[e.msg]
			s.routers[e.router].dec.PeerDecision(s.routers[m.peer].id, s.nodes[m.node].id, m.offset, m.hashes, now)
			s.release(e.msg)
		case evShareLoad:
			m := &s.msgs[e.msg]
			s.routers[e.router].dec.SetPeerLoad(s.routers[m.peer].id, m.part, m.parts, m.loads, now)
			s.release(e.msg)
		case evShareTTFT:
			s.routers[e.router].dec.PeerTTFT(s.msgs[e.msg].ttft)
			s.release(e.msg)
		case evShareTick:
			s.routers[e.router].shareTick(s)
		}
	}
	prefill := make([]float64, len(s.nodes))
	peak := make([]float64, len(s.nodes))
	for i, n := range s.nodes {
		prefill[i] = float64(n.prefillDone)
		peak[i] = float64(s.peak[i])
	}
	r := s.col.result(s.name, prefill, peak)
	r.Routers, r.Sharing = s.cfg.Routers, s.sharing()
	if s.cfg.PrefillNodes > 0 {
		r.PrefillNodes, r.Disaggregate = s.cfg.PrefillNodes, string(s.cfg.Disaggregate)
		if n := len(s.trace.Requests); n > 0 {
			r.RemotePrefillShare = float64(s.remote) / float64(n)
		}
	}
	if secs := s.q.now.Seconds(); secs > 0 {
		r.NodeGossipBytesPerNodePerSec = float64(s.nodeBytes) / float64(len(s.nodes)) / secs
		r.ShareBytesPerRouterPerSec = float64(s.shareBytes) / float64(len(s.routers)) / secs
	}
	r.ShareMessages, r.ShareLost = s.shareMsgs, s.shareLost
	for _, rt := range s.routers {
		r.Repairs += rt.repairs
	}
	return r, nil
}

// admit hands arriving request r to its router and returns how long the router waits before
// deciding (0: at once).
func (s *Sim) admit(r int) time.Duration {
	req := &s.trace.Requests[r]
	ri := s.rr % len(s.routers)
	if req.SessionKey != 0 {
		ri = int(req.SessionKey % uint64(len(s.routers))) // a session's requests reach one router
	} else {
		s.rr++
	}
	s.reqs[r].router = ri
	if s.cfg.NoAdmissionDelay {
		return 0
	}
	return s.routers[ri].admissionWait(s, req)
}

// route has request r's router choose a node (and under disaggregation a prefill node); the
// request joins the node that computes its prompt.
func (s *Sim) route(r int) error {
	req := &s.trace.Requests[r]
	ri := s.reqs[r].router
	rt := s.routers[ri]
	d, err := rt.route(s, req)
	if err != nil {
		return fmt.Errorf("route request %d: %w", r, err)
	}
	st := &s.reqs[r]
	st.router, st.node, st.estimate, st.ticket, st.pnode = ri, d.node, d.choice.MatchedTokens, d.choice.Ticket, d.prefill
	s.inFlight[d.node]++
	s.peak[d.node] = max(s.peak[d.node], s.inFlight[d.node])
	if d.prefill < 0 {
		n := s.nodes[d.node]
		n.enqueue(s, r, legWhole)
		s.changed(n)
		return nil
	}
	s.remote++
	st.pticket, st.estimate, st.plan = d.plan.Ticket, d.plan.MatchedTokens, d.plan.Plan
	s.inFlight[d.prefill]++
	s.peak[d.prefill] = max(s.peak[d.prefill], s.inFlight[d.prefill])
	p := s.nodes[d.prefill]
	p.enqueue(s, r, legPrefill)
	s.changed(p)
	return nil
}

// firstToken: request r's first token is out on n (a whole request, or a decode leg after its
// pull); a decode leg's router learns the transfer from it.
func (s *Sim) firstToken(n *node, r int) {
	st := &s.reqs[r]
	now := epoch0.Add(s.q.now)
	s.col.ttft = append(s.col.ttft, seconds(s.q.now-s.trace.Requests[r].Arrival))
	st.ticket.FirstToken(now)
	if st.pnode >= 0 {
		// What the router sees: the prefill leg answered, the decode leg's first byte came
		// later; the difference is the transfer as far as it can tell.
		s.routers[st.router].dec.ObserveTransfer(&st.plan, (s.q.now - st.answered).Seconds())
	}
}

// prefillAnswered: request r's prefill leg answered on prefill node p; its router sends the
// decode leg to the decode node, which pulls the KV it lacks.
func (s *Sim) prefillAnswered(p *node, r int) {
	st := &s.reqs[r]
	now := epoch0.Add(s.q.now)
	st.pticket.FirstToken(now)
	st.pticket.Done(now, true)
	st.pticket = nil
	s.inFlight[p.idx]--
	st.answered = s.q.now
	d := s.nodes[st.node]
	d.enqueue(s, r, legDecode)
	s.changed(d)
}

// pullKV starts decode node n's pull of request r's KV, lacked tokens of it, from its prefill
// node: Config.KVTransferOverhead + lacked / Config.KVTransferTokensPerSec, the ground truth.
func (s *Sim) pullKV(n *node, r, lacked int) {
	t := s.cfg.KVTransferOverhead
	if lacked > 0 {
		t += time.Duration(float64(lacked) / s.cfg.KVTransferTokensPerSec * float64(time.Second))
	}
	s.q.schedule(event{at: s.q.now + t, kind: evKVReady, node: n.idx, req: r})
}

// end closes request r's in-flight record at its router: ok after its last token, not ok when
// it was rejected (its prefix is then taken back out of the overlay).
func (s *Sim) end(r int, ok bool) {
	st := &s.reqs[r]
	st.ticket.Done(epoch0.Add(s.q.now), ok)
	st.ticket = nil
	s.inFlight[st.node]--
	s.ended++
}

// admitted records the node's actual match at admission, matched tokens on the GPU and loaded
// from the CPU tier, for hit ratio and estimate accuracy; the estimate is compared with what a
// vLLM engine would report for that match as cached_tokens (local.EngineCachedTokens of both, as
// vLLM counts its connector's tokens), as the daemons compare it with the engine's report.
func (s *Sim) admitted(r, matched, loaded int) {
	n := len(s.trace.Requests[r].Tokens)
	s.col.promptTokens += int64(n)
	s.col.matchedTokens += int64(matched + loaded)
	s.col.loadedTokens += int64(loaded)
	s.col.estimate(s.reqs[r].estimate, local.EngineCachedTokens(matched+loaded, n, s.cfg.BlockSize))
}

// reject drops a request that node n can never hold (as leg l): a prefill leg takes its decode
// leg with it, and a decode leg frees its prefill node's lease.
func (s *Sim) reject(n *node, r int, l leg) {
	st := &s.reqs[r]
	switch l {
	case legPrefill:
		st.pticket.Done(epoch0.Add(s.q.now), false)
		st.pticket = nil
		s.inFlight[n.idx]--
	case legDecode:
		p := s.nodes[st.pnode]
		p.endLease(r)
		s.changed(p)
	}
	s.col.rejected++
	s.end(r, false)
}

// Sizes of the node → router messages as cluster encodes them (cluster/delta.go, state.go):
// a delta is 37 bytes plus the node id, one bit and 8 bytes per event, split into packets of at
// most deltaPacketEvents events (cluster.MaxDeltaEvents for short ids); a state (load) report is
// 59 bytes plus the node id.
const (
	deltaFixed        = 37
	deltaPacketEvents = 150
	stateFixed        = 59
)

func deltaBytes(id string, events int) int64 {
	packets := max(1, (events+deltaPacketEvents-1)/deltaPacketEvents)
	return int64(packets*(deltaFixed+len(id)) + 8*events + (events+7)/8)
}

// changed publishes what changed on n: its summary delta (or a snapshot when the journal
// overflowed) to every router, each copy lost independently, reaching them after Delay; and,
// without a LoadInterval, its load too.
func (s *Sim) changed(n *node) {
	ni := n.idx
	at := s.q.now + s.cfg.Delay
	var head uint64
	var ok bool
	s.events, head, ok = n.sum.since(n.published, s.events[:0])
	switch {
	case !ok:
		m := s.newMessage(ni)
		msg := &s.msgs[m]
		msg.snapshot, head = n.sum.snapshot(msg.snapshot[:0])
		msg.full, msg.to = true, head
		s.fanOut(m, at, evDelta) // a snapshot is pulled over gRPC: not lost
	case len(s.events) > 0:
		m := s.newMessage(ni)
		msg := &s.msgs[m]
		msg.from, msg.to = n.published, head
		for _, e := range s.events {
			msg.changes = append(msg.changes, routing.Change{Hash: e.Hash, Added: e.Added})
		}
		s.nodeBytes += deltaBytes(n.id, len(s.events)) * int64(len(s.routers))
		s.fanOutLossy(m, at, evDelta, s.cfg.Loss)
	}
	n.published = head
	if s.cfg.LoadInterval == 0 {
		s.sendLoad(n)
	}
}

// loadTick is a node's periodic load check: it reports when the load changed since its last
// report, or a second has passed (the daemons' heartbeat).
func (s *Sim) loadTick(n *node) {
	l := n.load(s.q.now)
	l.head = n.published
	last := n.lastLoad
	if l.running != last.running || l.waiting != last.waiting || l.queued != last.queued ||
		l.freeBlocks != last.freeBlocks || l.head != last.head || s.q.now-last.at >= time.Second {
		s.sendLoad(n)
	}
	if s.running() {
		s.q.schedule(event{at: s.q.now + s.cfg.LoadInterval, kind: evLoadTick, node: n.idx})
	}
}

func (s *Sim) sendLoad(n *node) {
	m := s.newMessage(n.idx)
	s.msgs[m].load = n.load(s.q.now)
	s.msgs[m].load.head = n.published
	n.lastLoad = s.msgs[m].load
	s.nodeBytes += int64(stateFixed+len(n.id)) * int64(len(s.routers))
	s.fanOut(m, s.q.now+s.cfg.Delay, evLoad)
}

// fanOut delivers message m to every router at at.
func (s *Sim) fanOut(m int, at time.Duration, kind eventKind) { s.fanOutLossy(m, at, kind, 0) }

// fanOutLossy delivers message m to every router at at, each copy lost with probability loss.
func (s *Sim) fanOutLossy(m int, at time.Duration, kind eventKind, loss float64) {
	for r := range s.routers {
		if loss > 0 && s.rng.Float64() < loss {
			continue // lost on the wire
		}
		s.msgs[m].refs++
		s.q.schedule(event{at: at, kind: kind, router: r, msg: m})
	}
	if s.msgs[m].refs == 0 {
		s.freeMessage(m)
	}
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

// release marks one delivery of message i done, recycling it after the last.
func (s *Sim) release(i int) {
	if s.msgs[i].refs--; s.msgs[i].refs <= 0 {
		s.freeMessage(i)
	}
}

// freeMessage recycles a delivered message, keeping its slices' capacity.
func (s *Sim) freeMessage(i int) {
	m := &s.msgs[i]
	*m = message{changes: m.changes[:0], snapshot: m.snapshot[:0], hashes: m.hashes[:0], loads: m.loads[:0]}
	s.freeMsg = append(s.freeMsg, i)
}
