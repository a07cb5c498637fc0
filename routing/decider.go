package routing

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prefixmesh/prefixmesh/local"
)

// Decider is the router's one decision path (docs/architecture.md, "One request"; POLICIES.md,
// "Many routers"): the gRPC Route, the HTTP front door and the simulator all choose through it, so
// the same request meets the same code and the same state. It owns what only this router knows —
// its in-flight requests per node and the overlay of prefixes it has just routed — and folds in
// what other routers told it about theirs (decider_peers.go). For a request it hashes the prompt
// once per block size among the candidates, estimates each candidate's matched tokens as max(index,
// overlay) × block size (0 for a cold node, NodeInfo.Cold), fills the in-flight fields of every
// candidate (this router's plus its peers'), applies the per-node in-flight cap and lets the policy
// choose, all under one lock with the load it saw, so concurrent requests see each other.
// Committing a decision (Begin or Record) updates the in-flight counts and the overlay and reports
// it to the OnDecision hook, which a sharer sends to the other routers. It does no IO, starts no
// goroutines and reads the clock only through `now` arguments. Safe for concurrent use.
type Decider struct {
	index   *Index
	overlay *Overlay // nil: no overlay
	policy  Policy
	maxPer  int
	hooks   DeciderHooks
	totals  decisionTotals // what committed decisions expected to reuse (Totals)

	mu     sync.Mutex // guards own, peers, pending and conc; serializes Choose with the load it saw
	own    map[string]*InFlight
	peers  peerLoads
	conc   concurrency
	slot   time.Duration // AdmissionWait's turn per router ahead
	id     string        // the name peers know this router by (SetRouterID): its stagger rank
	spread bool          // pass the learned concurrency to the policy

	pending []*Ticket // committed requests before their first token, in a deterministic order

	// learned is what this router has learned of each node's TTFT from its own requests'
	// first tokens (ttft.go); guarded by mu, dropped by ForgetNode. nominal is the policy's
	// default prefill rate, the learner's unit of work.
	learned    map[string]*ttftLearner
	tierCosts  map[string]*tierLearner // each node's learned tier load costs (tiers.go)
	transfer   TransferLearner         // KV moved between nodes (decider_disagg.go)
	learnedGen uint64                  // changes whenever learned gains or loses a node (Choice.learned)
	fleet      ttftLearner
	noLearn    bool
	outbox     ttftOutbox // first tokens for the peers (decider_ttft.go)
	pcfg       PolicyConfig

	// commits counts decisions committed (Begin or Record): a decision that estimated before
	// another committed estimates again under mu.
	commits atomic.Uint64
	// blockSize is the last decided request's block size: the tokens per hash of a peer's
	// shared decision.
	blockSize atomic.Int64
	// refreshMu serializes RefreshPending; refresh is its copy of what is due, reported
	// outside mu.
	refreshMu sync.Mutex
	refresh   []refreshItem
	refreshH  []uint64

	afterEstimate func() // tests only: called between the estimate and taking mu

	tickets sync.Pool // *Ticket
}

// refreshItem is one pending decision due to be reported again: its node and hashes (a range of
// Decider.refreshH).
type refreshItem struct {
	node     string
	from, to int
}

// deciders counts the Deciders made, to give each its own range of learnedGen.
var deciders atomic.Uint64

// InFlight is a router's load on one node: requests sent and not finished, their prompt tokens,
// and the uncached prefill tokens of those not yet at their first token.
type InFlight struct {
	Requests, Tokens, PrefillTokens int
}

func (l *InFlight) add(o InFlight) {
	l.Requests += o.Requests
	l.Tokens += o.Tokens
	l.PrefillTokens += o.PrefillTokens
}

func (l *InFlight) sub(o InFlight) {
	l.Requests -= o.Requests
	l.Tokens -= o.Tokens
	l.PrefillTokens -= o.PrefillTokens
}

func (l InFlight) zero() bool { return l == InFlight{} }

// DeciderHooks receive committed decisions; hashes are only valid during the call. Decide and
// RefreshPending call them outside the decider's lock, so a hook may take its time (a sharer
// encodes and queues packets: router/peershare) and may call back into the Decider. Nil hooks are
// skipped.
type DeciderHooks struct {
	// OnDecision: a request with these block hashes was routed to node, whose summary (as the
	// index holds it) already reports the first indexed of them.
	OnDecision func(node string, hashes []uint64, indexed int, now time.Time)
}

// DeciderConfig configures a Decider.
type DeciderConfig struct {
	// MaxInFlightPerNode is a hard cap on the requests in flight to one node as this router
	// sees them (its own and its peers'), beyond the policy's bounded-load guard (which is
	// relative to the mean and so never refuses); when every candidate is at the cap Decide
	// answers ErrOverloaded. 0 (default) disables it: the engine's own queue bound is the
	// backstop then.
	MaxInFlightPerNode int
	// PeerLoadTTL is how long another router's load report counts without a refresh
	// (DefaultPeerLoadTTL when 0).
	PeerLoadTTL time.Duration
	// ConcurrencyWindow is how long after each of its decisions this router counts its peers'
	// decisions as taken unseen beside it (concurrency.go; DefaultConcurrencyWindow when 0).
	ConcurrencyWindow time.Duration
	// AdmissionSlot is AdmissionWait's turn per router ahead in the stagger
	// (DefaultAdmissionSlot when 0; negative disables the stagger).
	AdmissionSlot time.Duration
	// NoTTFTLearning keeps every node at the prior fit (TTFTFit's zero value: the nominal
	// prefill rate, no overhead, no decode term), to measure what learning does.
	NoTTFTLearning bool
	// Spread passes the learned concurrency to the policy (Request.Concurrency), so prefixmesh
	// spreads a request over the nodes a burst would fill. Off by default: with TTFTs learned
	// per node and sessions that only win ties, the stagger alone held Mooncake's bursts as well
	// (routing/POLICIES.md, "Bursts"), and the spread cost locality on the other traces.
	Spread bool
	Hooks  DeciderHooks
}

// NewDecider returns a decider over the summary index, the overlay (nil disables it) and a
// policy.
func NewDecider(index *Index, overlay *Overlay, policy Policy, cfg DeciderConfig) (*Decider, error) {
	if index == nil || policy == nil {
		return nil, fmt.Errorf("new decider: an index and a policy are required: %w", ErrInvalid)
	}
	if cfg.MaxInFlightPerNode < 0 || cfg.PeerLoadTTL < 0 || cfg.ConcurrencyWindow < 0 {
		return nil, fmt.Errorf("new decider: MaxInFlightPerNode %d, PeerLoadTTL %v must not be negative: %w",
			cfg.MaxInFlightPerNode, cfg.PeerLoadTTL, ErrInvalid)
	}
	ttl := cfg.PeerLoadTTL
	if ttl == 0 {
		ttl = DefaultPeerLoadTTL
	}
	d := &Decider{index: index, overlay: overlay, policy: policy, maxPer: cfg.MaxInFlightPerNode, hooks: cfg.Hooks,
		own: make(map[string]*InFlight), peers: newPeerLoads(ttl), learned: make(map[string]*ttftLearner),
		tierCosts:  make(map[string]*tierLearner),
		learnedGen: deciders.Add(1) << 32} // a Choice used with another decider never matches its generation
	d.pcfg = DefaultPolicyConfig()
	if p, ok := policy.(interface{ Config() PolicyConfig }); ok {
		d.pcfg = p.Config()
	}
	d.spread = cfg.Spread
	d.noLearn = cfg.NoTTFTLearning
	d.slot = cfg.AdmissionSlot
	if d.slot == 0 {
		d.slot = DefaultAdmissionSlot
	}
	d.conc.window = cfg.ConcurrencyWindow
	if d.conc.window == 0 {
		d.conc.window = DefaultConcurrencyWindow
	}
	// A node that left or restarted frees its overlay slot: what this router expected on it
	// is gone with its cache, and slots kept for departed ids slow every estimate.
	index.OnRemove(d.ForgetNode)
	return d, nil
}

// SetHooks replaces the hooks (before the decider is used concurrently with the change).
func (d *Decider) SetHooks(h DeciderHooks) { d.hooks = h }

// Policy returns the decider's policy.
func (d *Decider) Policy() Policy { return d.policy }

// Index returns the summary index the decider reads.
func (d *Decider) Index() *Index { return d.index }

// Overlay returns the decider's overlay (nil when disabled).
func (d *Decider) Overlay() *Overlay { return d.overlay }

// DecideRequest is the request being routed.
type DecideRequest struct {
	Tokens     []uint32 // the prompt, as the engine will see it
	AdapterID  uint64
	Model      string
	SessionKey uint64 // 0 = none; SessionKey(name) for a named session
}

// Commit says what a decision changes.
type Commit uint8

const (
	// CommitNone only decides (a dry run: nothing is recorded).
	CommitNone Commit = iota
	// CommitRecord records the routed prefix in the overlay with the TTL and reports the
	// decision, but counts nothing in flight: the router will not see the request end (gRPC
	// Route, where the client sends the request itself).
	CommitRecord
	// CommitBegin counts the request in flight on the chosen node and holds its prefix in the
	// overlay until the Ticket's FirstToken or Done (the HTTP front door).
	CommitBegin
)

// Choice is a decision and its working memory; reuse one per goroutine so steady-state decisions
// do not allocate. Node and Candidates[i].Node index the nodes slice given to Decide.
type Choice struct {
	Node          int
	MatchedTokens int
	Reason        string
	Candidates    []Candidate
	// Hashes are the prompt's block hashes at the chosen node's block size (valid until the next
	// Decide with this Choice).
	Hashes []uint64
	// Ticket is the committed request (CommitBegin only): call its Done exactly once.
	Ticket *Ticket
	// Tiers is the chosen node's match per tier (TierTokens): the GPU prefix and what its
	// lower tiers add. MatchedTokens is their sum as the engine will report it.
	Tiers TierTokens

	dec     Decision
	rq      Request
	ids     []string
	orig    []int
	blocks  []int
	iblocks []int
	pulls   []int     // PlanPeerPull's scratch: each candidate's computed GPU run, in blocks then tokens
	at      time.Time // when Decide decided
	matched []int
	lower   []TierTokens // per candidate: what lower tiers add to its GPU match
	hashes  []uint64
	extra   []uint64
	learned idMemo[*ttftLearner] // each candidate's learner (nil: none), kept for the next decision
}

// Decide chooses a node among nodes for req and commits the decision as commit says. nodes are
// the candidates (the caller has already left out dead, draining, ejected and excluded nodes,
// and those a pinned adapter may not use); Decide overwrites their InFlight fields with this
// router's and its peers' counts and does not reorder them. It answers ErrNoCandidates when nodes
// is empty and ErrOverloaded when every candidate is at MaxInFlightPerNode or over the policy's
// load guard.
func (d *Decider) Decide(req *DecideRequest, nodes []NodeInfo, now time.Time, commit Commit, c *Choice) error {
	c.Node, c.MatchedTokens, c.Reason, c.Ticket, c.at = -1, 0, "", nil, now
	c.Candidates = c.Candidates[:0]
	if len(nodes) == 0 {
		return ErrNoCandidates
	}
	k := len(nodes)
	c.ids = grow(c.ids, k)
	for i := range nodes {
		c.ids[i] = nodes[i].ID
	}
	c.blocks, c.matched, c.iblocks = grow(c.blocks, k), grow(c.matched, k), grow(c.iblocks, k)
	c.lower = grow(c.lower, k)
	bs0 := blockSizeOf(&nodes[0])
	if int64(bs0) != d.blockSize.Load() {
		d.blockSize.Store(int64(bs0))
	}
	c.hashes = local.AppendBlockHashes(c.hashes[:0], req.Tokens, bs0, req.AdapterID)
	// The estimate (an index walk) runs outside the lock so that decisions estimate in
	// parallel; commits counts what this router committed since, and a decision that sees it
	// moved estimates again under the lock, so a burst on one router sees its own prefixes.
	seen := d.commits.Load()
	d.fill(req, nodes, bs0, c, now)
	if d.afterEstimate != nil {
		d.afterEstimate()
	}
	// In the Choice, not on the stack: the policy is an interface, so &rq would escape, one
	// allocation per decision.
	rq := &c.rq
	*rq = Request{Hashes: c.hashes, PromptTokens: len(req.Tokens), AdapterID: req.AdapterID, Model: req.Model,
		SessionKey: req.SessionKey, BlockSize: bs0, Tiers: c.lower}

	d.mu.Lock()
	if d.commits.Load() != seen {
		d.fill(req, nodes, bs0, c, now)
	}
	d.peers.expire(now)
	if d.spread {
		rq.Concurrency = d.conc.estimate(now)
	}
	span := admissionSpan(d.peers.peers(), d.slot)
	// Keep the candidates under the cap; orig maps the kept ones back to the caller's indices.
	c.orig = c.orig[:0]
	kept := 0
	atCap := false
	learners := c.learned.resolve(c.ids, d.learnedGen, func(id string) *ttftLearner { return d.learned[id] })
	for i := range nodes {
		n := &nodes[i]
		l := d.inFlightLocked(n.ID)
		n.InFlight, n.InFlightTokens, n.InFlightPrefillTokens = l.Requests, l.Tokens, l.PrefillTokens
		n.TTFT = d.fleet.fit
		if ln := learners[i]; ln != nil && ln.distinctFrom(d.fleet.fit) {
			n.TTFT = ln.fit
		}
		n.TTFT.FleetScale = d.fleet.fit.PrefillScale()
		n.TierLoad = d.tierLoadLocked(n.ID)
		if d.maxPer > 0 && n.InFlight >= d.maxPer {
			atCap = true
			continue
		}
		c.orig = append(c.orig, i)
		kept++
	}
	if kept == 0 {
		d.mu.Unlock()
		if atCap {
			return ErrOverloaded
		}
		return ErrNoCandidates
	}
	cands, matched := nodes, c.matched
	if kept < k {
		// Gather the kept candidates into the front of a scratch copy (rare: only with a cap).
		cands = make([]NodeInfo, kept)
		matched = c.blocks[:kept] // blocks is no longer needed
		tiers := make([]TierTokens, kept)
		for j, i := range c.orig {
			cands[j], matched[j], tiers[j] = nodes[i], c.matched[i], c.lower[i]
		}
		rq.Tiers = tiers
	}
	if err := d.policy.Choose(rq, cands, matched, now, &c.dec); err != nil {
		d.mu.Unlock()
		return err
	}
	if allExcluded(c.dec.Candidates) {
		d.mu.Unlock()
		return ErrOverloaded
	}
	chosen := c.orig[c.dec.Node]
	// Callers see what the engine will report as cached_tokens: vLLM's rule that a fully cached
	// prompt recomputes its last token (local.EngineCachedTokens, the one place it lives; the
	// simulated engine reports by it too). The policy ranked the raw matches, at most a block apart.
	prompt := len(req.Tokens)
	// The lower tiers' tokens count too: the engine loads them and reports them cached.
	c.Node, c.Reason = chosen, c.dec.Reason
	c.Tiers = c.lower[chosen]
	c.Tiers[local.TierGPU] = c.dec.MatchedTokens
	c.MatchedTokens = local.EngineCachedTokens(c.Tiers.Total(), prompt, blockSizeOf(&nodes[chosen]))
	for _, cd := range c.dec.Candidates {
		cd.Node = c.orig[cd.Node]
		cd.MatchedTokens = local.EngineCachedTokens(cd.MatchedTokens+c.lower[cd.Node].Lower(), prompt, blockSizeOf(&nodes[cd.Node]))
		c.Candidates = append(c.Candidates, cd)
	}
	id := nodes[chosen].ID
	c.Hashes = c.hashes
	if bs := blockSizeOf(&nodes[chosen]); bs != bs0 {
		c.extra = local.AppendBlockHashes(c.extra[:0], req.Tokens, bs, req.AdapterID)
		c.Hashes = c.extra
	}
	// The overlay holds only the part of the chain beyond what the node's summary reports: an
	// estimate extends the index's run with it (Overlay.Estimate), so a cached prefix costs
	// nothing to hold, and a prefix the node has since evicted ends the run early (an
	// under-report, never a false hit).
	indexed := c.iblocks[chosen]
	hold := c.Hashes[min(indexed, len(c.Hashes)):]
	var t *Ticket
	switch commit {
	case CommitBegin:
		t = d.beginLocked(id, InFlight{Requests: 1, Tokens: len(req.Tokens), PrefillTokens: max(0, len(req.Tokens)-c.MatchedTokens)}, hold, now)
		// What the policy saw of the chosen node, to learn from when the first token comes.
		t.decided = now
		d.noteTiers(t, &cands[c.dec.Node], &c.Tiers)
		t.work, t.seqs = ttftFeatures(&cands[c.dec.Node], prompt-c.Tiers[local.TierGPU]-t.credited, &d.pcfg)
		c.Ticket = t
		d.conc.ownDecision(now, span)
	case CommitRecord:
		if d.overlay != nil {
			d.overlay.Record(id, hold, now)
		}
		d.commits.Add(1)
		d.conc.ownDecision(now, span)
	}
	d.mu.Unlock()

	if commit != CommitNone {
		d.totals.add(prompt, c.MatchedTokens, &c.Tiers, c.matched[:k], c.lower[:k], nodes)
	}
	if commit != CommitNone && d.hooks.OnDecision != nil {
		d.hooks.OnDecision(id, c.Hashes, indexed, now)
	}
	return nil
}

// fill estimates each candidate's matched blocks (index and overlay) from c.hashes, the prompt
// hashed at bs0, into c.blocks, c.iblocks and c.matched, hashing again for a candidate of another
// block size.
func (d *Decider) fill(req *DecideRequest, nodes []NodeInfo, bs0 int, c *Choice, now time.Time) {
	d.estimate(c.hashes, c.ids, c.blocks, c.iblocks, now)
	mixed := false
	for i := range nodes {
		c.matched[i] = c.blocks[i] * bs0
		if blockSizeOf(&nodes[i]) != bs0 {
			mixed = true
		}
	}
	if mixed { // rare: a fleet normally has one block size
		for i := range nodes {
			if bs := blockSizeOf(&nodes[i]); bs != bs0 {
				c.extra = local.AppendBlockHashes(c.extra[:0], req.Tokens, bs, req.AdapterID)
				d.estimate(c.extra, c.ids[i:i+1], c.blocks[i:i+1], c.iblocks[i:i+1], now)
				c.matched[i] = c.blocks[i] * bs
			}
		}
	}
	for i := range nodes {
		if nodes[i].Cold { // a summary that may over-estimate: no affinity from it, nor from the overlay on top of it
			c.blocks[i], c.iblocks[i], c.matched[i] = 0, 0, 0
		}
	}
	d.index.ContinueLower(c.hashes, c.ids, c.blocks, bs0, c.lower)
	for i := range nodes {
		if bs := blockSizeOf(&nodes[i]); nodes[i].Cold || (mixed && bs != bs0) {
			// Cold: no credit from it. Another block size: its tier keys hash at its size
			// (rare; its lower tiers are left out rather than hashed again).
			c.lower[i] = TierTokens{}
		}
	}
}

// inFlightLocked is this router's plus its peers' load on node. Callers hold mu.
func (d *Decider) inFlightLocked(node string) InFlight {
	var l InFlight
	if o := d.own[node]; o != nil {
		l = *o
	}
	l.add(d.peers.sum(node))
	return l
}

// estimate writes the index's matched blocks per node into iblocks and the leading run of index
// and overlay together into blocks.
func (d *Decider) estimate(hashes []uint64, ids []string, blocks, iblocks []int, now time.Time) {
	d.index.Estimate(hashes, ids, blocks)
	copy(iblocks, blocks)
	if d.overlay != nil {
		d.overlay.Estimate(hashes, ids, blocks, now)
	}
}

// SetRouterID names this router as its peers know it (the sharer's router id), which orders
// the routers' turns in a burst (AdmissionWait). Call before deciding.
func (d *Decider) SetRouterID(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.id = id
}

// Concurrency returns how many decisions this router expects its peers to take, unseen, beside
// one of its own at now (concurrency.go).
func (d *Decider) Concurrency(now time.Time) float64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.conc.estimate(now)
}

// OwnInFlight returns this router's own load on node (not its peers').
func (d *Decider) OwnInFlight(node string) InFlight {
	d.mu.Lock()
	defer d.mu.Unlock()
	if l := d.own[node]; l != nil {
		return *l
	}
	return InFlight{}
}

// TotalInFlight returns the load on node as this router sees it: its own plus its peers'.
func (d *Decider) TotalInFlight(node string, now time.Time) InFlight {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.peers.expire(now)
	return d.inFlightLocked(node)
}

// AppendOwnLoads appends this router's non-zero load per node, for a sharer's load report.
func (d *Decider) AppendOwnLoads(dst []NodeInFlight) []NodeInFlight {
	d.mu.Lock()
	defer d.mu.Unlock()
	for id, l := range d.own {
		dst = append(dst, NodeInFlight{Node: id, InFlight: *l})
	}
	return dst
}

// NodeInFlight is one node's line in a load report.
type NodeInFlight struct {
	Node string
	InFlight
}

// Expire drops expired overlay buckets and peer reports. Daemons call it periodically (every
// overlay bucket width keeps memory tight).
func (d *Decider) Expire(now time.Time) {
	if d.overlay != nil {
		d.overlay.Expire(now)
	}
	d.mu.Lock()
	d.peers.expire(now)
	d.mu.Unlock()
}

// ForgetNode drops everything this router recorded for node in its overlay and frees its slot
// (it left or restarted). The index calls it (Index.OnRemove) when the mirror removes a node or
// installs a summary of a new epoch. In-flight counts stay until their requests end; their
// first tokens then record nothing for a node the index no longer holds.
func (d *Decider) ForgetNode(node string) {
	d.mu.Lock()
	delete(d.learned, node)
	delete(d.tierCosts, node)
	d.learnedGen++
	d.mu.Unlock()
	if d.overlay != nil {
		d.overlay.ForgetNode(node)
	}
	d.commits.Add(1)
}

// Ticket is one committed (CommitBegin) request. FirstToken (optional, at most once) ends its
// prefill; Done (exactly once) ends it. Both are safe to call from any goroutine; calls after
// Done are ignored.
type Ticket struct {
	d    *Decider
	node string
	load InFlight
	// d.mu guards these two: when the decision was last reported to OnDecision, and the
	// ticket's position in d.pending until its first token.
	shared    time.Time
	pendingAt int
	// When the decision was taken and the TTFT features of the chosen node then (ttft.go):
	// written before the ticket is handed out, read at the first token.
	decided    time.Time
	work, seqs float64
	// The chosen node's lower-tier tokens then, the part credited and the load time predicted
	// for them (seconds), to learn the tiers' load costs from (tiers.go).
	tiers    TierTokens
	credited int
	loadSec  float64
	secPer   float64 // the node's prefill seconds per token then

	mu     sync.Mutex // guards everything below
	hashes *[]uint64  // held in the overlay until the first token; back to the pool at Done
	first  bool
	done   bool
}

// newTicket copies hashes into a pooled buffer: the one piece of a request's state that grows
// with the prompt, so that steady-state decisions allocate nothing of that size.
func (d *Decider) newTicket(node string, load InFlight, hashes []uint64) *Ticket {
	b, _ := d.tickets.Get().(*[]uint64)
	if b == nil {
		b = new([]uint64)
	}
	*b = append((*b)[:0], hashes...)
	return &Ticket{d: d, node: node, load: load, hashes: b}
}

// RefreshPending reports again, through OnDecision, every committed request still waiting for
// its first token whose decision was last reported at least every ago: a request queued behind
// a long prefill queue may wait longer than the overlay's TTL, and until it computes its prompt
// no summary reports the prefix, so other routers must keep hearing of it as this router keeps
// holding it (Overlay.Begin). Sharers call it periodically with half the overlay TTL. The
// hashes reported are the part of the chain the overlay holds (indexed 0).
func (d *Decider) RefreshPending(now time.Time, every time.Duration) {
	if d.hooks.OnDecision == nil {
		return
	}
	d.refreshMu.Lock()
	defer d.refreshMu.Unlock()
	// Copy what is due under mu (Done cannot recycle a ticket's hashes before it has taken mu
	// to drop it), then report outside it: a sharer encodes packets in the hook, and decisions
	// must not wait for that.
	d.refresh, d.refreshH = d.refresh[:0], d.refreshH[:0]
	d.mu.Lock()
	for _, t := range d.pending {
		if now.Sub(t.shared) >= every {
			t.shared = now
			from := len(d.refreshH)
			d.refreshH = append(d.refreshH, *t.hashes...)
			d.refresh = append(d.refresh, refreshItem{node: t.node, from: from, to: len(d.refreshH)})
		}
	}
	d.mu.Unlock()
	for _, r := range d.refresh {
		d.hooks.OnDecision(r.node, d.refreshH[r.from:r.to], 0, now)
	}
}

// Node is the node the request was routed to.
func (t *Ticket) Node() string { return t.node }

// FirstToken records that the request produced its first token at now: its prefill is no longer
// queued and the node has cached its prompt (the overlay keeps it for the TTL from now).
func (t *Ticket) FirstToken(now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.done {
		t.releaseLocked(now, true, false)
	}
}

// Done records that the request ended at now; ok says whether it succeeded (a failed request
// before its first token takes its prefix back out of the overlay).
func (t *Ticket) Done(now time.Time, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		return
	}
	t.done = true
	t.releaseLocked(now, ok, true)
	t.d.tickets.Put(t.hashes)
	t.hashes = nil
}

func (t *Ticket) releaseLocked(now time.Time, ok, end bool) {
	d := t.d
	firstTime := !t.first
	t.first = true
	d.mu.Lock()
	if firstTime { // swap-remove from pending
		last := d.pending[len(d.pending)-1]
		d.pending[t.pendingAt], last.pendingAt = last, t.pendingAt
		d.pending[len(d.pending)-1] = nil
		d.pending = d.pending[:len(d.pending)-1]
	}
	if firstTime && ok && !end {
		d.observeTTFT(t, now)
	}
	if l := d.own[t.node]; l != nil {
		if firstTime {
			l.PrefillTokens -= t.load.PrefillTokens
		}
		if end {
			l.Requests -= t.load.Requests
			l.Tokens -= t.load.Tokens
			if l.Requests <= 0 {
				delete(d.own, t.node)
			}
		}
	}
	d.mu.Unlock()
	if !firstTime {
		return
	}
	h := *t.hashes
	if d.overlay != nil {
		if ok && d.index.Has(t.node) {
			d.overlay.End(t.node, h, now)
		} else {
			d.overlay.Abort(t.node, h)
		}
	}
}

// beginLocked commits a request to node with its load and the part of its chain to hold: pending
// until its first token, counted in flight until Done, the held prefix in the overlay. Inside the
// critical section, so the next decision, waiting on mu, estimates with this request's prefix
// already held on its node. Callers hold mu.
func (d *Decider) beginLocked(node string, load InFlight, hold []uint64, now time.Time) *Ticket {
	t := d.newTicket(node, load, hold)
	t.shared, t.pendingAt = now, len(d.pending)
	d.pending = append(d.pending, t)
	l := d.own[node]
	if l == nil {
		l = new(InFlight)
		d.own[node] = l
	}
	l.add(t.load)
	if d.overlay != nil {
		d.overlay.Begin(node, *t.hashes, now)
	}
	d.commits.Add(1)
	return t
}

// blockSizeOf is the node's block size, 16 (vLLM's default) when it did not report one.
func blockSizeOf(n *NodeInfo) int {
	if n.BlockSize > 0 {
		return n.BlockSize
	}
	return 16
}

// allExcluded reports whether a policy marked every candidate as excluded by its load guard.
func allExcluded(c []Candidate) bool {
	if len(c) == 0 {
		return false
	}
	for i := range c {
		if !math.IsInf(c[i].Score, 1) {
			return false
		}
	}
	return true
}

// SessionKey is the routing key of a named session (a conversation id): the same name gives
// the same key in every router process and on every path (gRPC Route's session_id, the HTTP
// front door's X-Session-ID, session_id or user), so replicas agree on a session's node. 0 is
// "no session", so the empty name gives 0 and a name hashing to 0 gives 1.
func SessionKey(name string) uint64 {
	if name == "" {
		return 0
	}
	// FNV-1a (64-bit) then the splitmix64 finaliser: a fixed, seedless function.
	if k := mix64(nodeIDHash(name)); k != 0 {
		return k
	}
	return 1
}
