package sim

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/prefixmesh/prefixmesh/local"
	"github.com/prefixmesh/prefixmesh/local/kvpool"
	"github.com/prefixmesh/prefixmesh/routing"
)

// node is one simulated GPU node: the node agent's real cache (local.RadixTree) driving a real
// KV block pool (kvpool) exactly as the built-in simulated engine does, inside a
// continuous-batching engine that runs in steps on the virtual clock (kvpool.Step, see doc.go):
//
//   - arrivals queue FCFS (waiting);
//   - each step is filled as vLLM's scheduler fills one (vllm/v1/core/sched/scheduler.py): the
//     running sequences first, in admission order, a decoding one taking one token and a
//     prefilling one the rest of its prompt up to what is left of the token budget; then the
//     waiting head is admitted while budget and a sequence slot remain and the pool can hold it
//     (kvpool.Admit: lookup, evict under pressure, allocate), its first chunk taking what budget
//     is left (chunked prefill); a pool that is busy blocks the head until a sequence finishes;
//   - the step takes kvpool.Step.StepTime of its prefill tokens and decode sequences, so a prompt
//     chunk slows every decode sequence sharing the step;
//   - at the end of the step each decoding sequence has one more token (its inter-token latency
//     is the step's time), and a sequence whose last prompt chunk ran has its first token (TTFT):
//     its prompt is inserted into the tree; the last output token finishes the sequence, which
//     releases its blocks;
//   - with a CPU tier (Config.CPUBlocks), the blocks it holds right after the GPU prefix are
//     loaded at the load rate (kvpool.CPUTier.Load, kvpool.Costs.LoadTime) over the node's one
//     host-to-GPU lane, the sequence waiting outside the steps meanwhile (vLLM's
//     WAITING_FOR_REMOTE_KVS), and count as cached, as vLLM counts its connector's tokens.
//
// Under prefill/decode disaggregation a prefill node (routing.RolePrefill) runs prefill legs: the
// whole prompt is prefilled, its first token answers the leg and its blocks stay leased until
// the decode node has pulled them. A decode leg is admitted on its decode node like any request,
// then waits outside the steps while the KV it lacks moves from the prefill node
// (Config.KVTransferTokensPerSec), and computes only the prompt's last token (vLLM's decode
// engine reports the rest as cached) before decoding.
//
// With a CPU tier the pool's cache is a kvpool.SpillCache over the tree: the chunks the GPU
// evicts spill into the tier (LRU), the simulated engine's model exactly. The tier's blocks
// reach the routers in the node's summary (summary.go).
type node struct {
	idx   int // position in the fleet
	id    string
	epoch uint64
	role  routing.Role
	tree  *local.RadixTree
	cpu   *kvpool.CPUTier // nil without a CPU tier
	sum   *summary        // what the node publishes: the tree's and the tier's changes
	pool  *kvpool.Pool
	costs kvpool.Costs // LoadTime of the CPU tier
	step  kvpool.Step
	max   int // concurrent sequences (prefilling, waiting for KV and decoding)

	waiting    []queued // FCFS
	waitingTok int      // sum of waiting[i].uncached
	running    []*sequence
	byReq      map[int]*sequence // running and leased sequences
	leased     int               // prefill legs done, blocks held until the decode node pulls
	// Peer pulls (peerpull.go): the plan the router hands over with the request it routes here
	// (taken by the enqueue that follows), then each request's plan until its first token.
	nextPull pullPlan
	pulls    map[int]pullPlan

	stepping bool          // a step is under way
	batch    []scheduled   // the step's sequences
	stepDur  time.Duration // the step's time
	loadFree time.Duration // when the host-to-GPU lane is free

	// held counts, per pool block, the sequences using it; active is how many blocks have a
	// nonzero count. A node reports capacity − active as free, as vLLM does: a block that only
	// the cache holds is free to reuse (evictable), not busy.
	held   []int32
	active int

	published   uint64 // journal head already sent to the routers
	lastLoad    load   // the last load report sent
	prefillDone int64  // prompt tokens computed, for the imbalance metric
}

// leg is what a request is on a node.
type leg uint8

const (
	legWhole   leg = iota // a whole request (aggregated, or prefilled on its decode node)
	legPrefill            // a disaggregated request's prefill leg, on a prefill node
	legDecode             // a disaggregated request's decode leg, pulling its KV
)

// queued is a waiting request and its uncached tokens as peeked on arrival (the GPU prefix and
// what the CPU tier would load after it are not), which is what the node reports as queued
// prefill work (the engine cannot know the match before admission).
type queued struct {
	req, uncached int
	leg           leg
}

// sequence is an admitted request on a node.
type sequence struct {
	req     int
	leg     leg
	seq     *kvpool.Seq
	blocks  []uint32
	prefill int  // prompt tokens still to compute; 0 once the first token is out
	out     int  // output tokens still to produce after the first
	context int  // tokens in its KV
	waitKV  bool // loading from the CPU tier or pulling from a prefill node: not scheduled
	first   bool // its first token is out (decoding)
}

// scheduled is one sequence's share of a step.
type scheduled struct {
	s      *sequence
	tokens int
	decode bool
}

// Compile-time: a simulated node's cache is the node agent's cache type.
var _ local.PrefixCache = (*local.RadixTree)(nil)

func newNode(i int, cfg *Config) (*node, error) {
	tree := local.NewRadixTree(local.Options{})
	var (
		cache local.PrefixCache = tree
		cpu   *kvpool.CPUTier
		err   error
	)
	if cfg.CPUBlocks > 0 {
		if cpu, err = kvpool.NewCPUTier(cfg.CPUBlocks, cfg.CPUChunkBlocks, cfg.BlockSize); err != nil {
			return nil, fmt.Errorf("node %d: %w", i, err)
		}
		if cache, err = kvpool.NewSpillCache(tree, cpu, cfg.BlocksPerNode, cfg.BlockSize); err != nil {
			return nil, fmt.Errorf("node %d: %w", i, err)
		}
	}
	pool, err := kvpool.New(cache, cfg.BlocksPerNode, cfg.BlockSize)
	if err != nil {
		return nil, fmt.Errorf("node %d: %w", i, err)
	}
	speed := 1.0
	if len(cfg.NodeSpeeds) > 0 {
		speed = cfg.NodeSpeeds[i%len(cfg.NodeSpeeds)]
	}
	role := routing.RoleBoth
	if cfg.PrefillNodes > 0 {
		role = routing.RoleDecode
		if i < cfg.PrefillNodes {
			role = routing.RolePrefill
		}
	}
	// A slower node computes slower; its host-to-GPU copies (LoadTokensPerSec) do not.
	costs := kvpool.Costs{PrefillTokensPerSec: cfg.PrefillTokensPerSec * speed, DecodeTokensPerSec: cfg.DecodeTokensPerSec * speed,
		LoadTokensPerSec: cfg.CPULoadTokensPerSec}
	return &node{
		idx:   i,
		id:    "node-" + strconv.Itoa(i),
		epoch: uint64(i) + 1,
		role:  role,
		tree:  tree,
		cpu:   cpu,
		sum:   newSummary(tree, cpu),
		pool:  pool,
		costs: costs,
		step:  kvpool.FromCosts(costs, cfg.TokenBudget),
		max:   cfg.MaxConcurrent,
		byReq: make(map[int]*sequence),
		pulls: make(map[int]pullPlan),
		held:  make([]int32, cfg.BlocksPerNode),
	}, nil
}

// load is what the node reports to routers.
type load struct {
	at                        time.Duration
	running, waiting, queued  int
	freeBlocks, capacityBlock int
	head                      uint64 // summary journal head: lets the router detect a lost last delta
}

func (n *node) load(now time.Duration) load {
	queued := n.waitingTok
	for _, q := range n.running {
		queued += q.prefill
	}
	capacity := n.pool.Stats().Blocks
	return load{at: now, running: len(n.running), waiting: len(n.waiting), queued: queued,
		freeBlocks: capacity - n.active, capacityBlock: capacity}
}

// enqueue puts request r at the back of the waiting queue as leg l.
func (n *node) enqueue(s *Sim, r int, l leg) {
	req := &s.trace.Requests[r]
	q := queued{req: r, leg: l, uncached: 1} // a decode leg computes the prompt's last token
	if l != legDecode {
		cached := n.tree.PeekMatchedTokens(req.Tokens, s.cfg.BlockSize, 0)
		if n.cpu != nil {
			cached += n.cpu.Loadable(n.cpu.Peek(req.Tokens, 0, cached))
		}
		q.uncached = len(req.Tokens) - cached
	}
	if p := n.nextPull; l == legWhole && p.source >= 0 && p.tokens > 0 {
		n.pulls[r] = p // the engine knows its pull on arrival: it does not queue that prefill
		q.uncached = max(q.uncached-p.tokens, 1)
	}
	n.nextPull = pullPlan{source: -1}
	n.waitingTok += q.uncached
	n.waiting = append(n.waiting, q)
	n.kick(s)
}

// kick starts a step unless one is under way.
func (n *node) kick(s *Sim) {
	if !n.stepping {
		n.startStep(s)
	}
}

// startStep fills the next step (running sequences, then admissions) and schedules its end; with
// nothing to compute the node idles until an arrival or a KV transfer kicks it.
func (n *node) startStep(s *Sim) {
	b := n.step.NewBatch() // the step's budget, shared with the live engine (kvpool.Batch)
	n.batch = n.batch[:0]
	for _, q := range n.running {
		if b.Full() {
			break
		}
		switch {
		case q.waitKV:
		case q.first:
			b.AddDecode(q.context)
			n.batch = append(n.batch, scheduled{s: q, tokens: 1, decode: true})
		default:
			n.batch = append(n.batch, scheduled{s: q, tokens: b.AddPrefill(q.prefill)})
		}
	}
	for !b.Full() && len(n.waiting) > 0 && len(n.running) < n.max {
		q, busy := n.admit(s)
		if busy {
			break // head-of-line: wait for a finish to free blocks
		}
		if q == nil || q.waitKV {
			continue // rejected, or loading its KV
		}
		n.batch = append(n.batch, scheduled{s: q, tokens: b.AddPrefill(q.prefill)})
	}
	if len(n.batch) == 0 {
		return
	}
	n.stepping = true
	n.stepDur = n.step.Time(&b)
	n.prefillDone += int64(b.Prefill)
	s.q.schedule(event{at: s.q.now + n.stepDur, kind: evStep, node: n.idx})
}

// admit admits the waiting head: busy when the pool cannot hold it yet; nil when it was rejected
// (larger than the pool).
func (n *node) admit(s *Sim) (q *sequence, busy bool) {
	w := n.waiting[0]
	r := w.req
	req := &s.trace.Requests[r]
	out := req.OutputTokens
	if w.leg == legPrefill {
		out = 0 // the leg's one token comes from the prefill's forward pass
	}
	seq, err := n.pool.Admit(req.Tokens, 0, out)
	if errors.Is(err, kvpool.ErrPoolBusy) {
		return nil, true
	}
	n.waitingTok -= w.uncached
	n.waiting = n.waiting[1:]
	if err != nil { // ErrTooLarge: no amount of waiting makes it fit
		delete(n.pulls, r)
		s.reject(n, r, w.leg)
		return nil, false
	}
	blocks := seq.Blocks()
	for _, b := range blocks {
		if n.held[b]++; n.held[b] == 1 {
			n.active++
		}
	}
	q = &sequence{req: r, leg: w.leg, seq: seq, blocks: blocks, out: req.OutputTokens}
	n.running = append(n.running, q)
	n.byReq[r] = q
	matched := seq.MatchedTokens()
	if w.leg == legDecode {
		// It pulls what it lacks from the prefill node, then computes the last token.
		q.waitKV, q.prefill, q.context = true, 1, len(req.Tokens)-1
		s.pullKV(n, r, len(req.Tokens)-matched)
		return q, false
	}
	loaded := 0
	if n.cpu != nil {
		// vLLM asks its connector for the tokens past the local hit
		// (get_num_new_matched_tokens) and loads them into the sequence's fresh blocks, which
		// the insert after prefill puts on the GPU; the CPU copy stays.
		loaded = n.cpu.Load(req.Tokens, 0, matched)
	}
	// A peer pull fetches what its source holds past that hit (peerpull.go).
	pulled, pullTime := n.pullPeer(s, r, matched+loaded)
	s.admittedPull(r, matched, loaded, pulled)
	// vLLM computes at least the prompt's last token: its logits give the first token.
	q.prefill = max(len(req.Tokens)-matched-loaded-pulled, 1)
	q.context = len(req.Tokens) - q.prefill
	ready := s.q.now
	if loaded > 0 {
		start := max(s.q.now, n.loadFree)
		n.loadFree = start + n.costs.LoadTime(loaded)
		ready = n.loadFree
	}
	if pulled > 0 {
		ready += pullTime // after the local load, as the engine asks the peer for what is past it
	}
	if loaded > 0 || pulled > 0 {
		q.waitKV = true
		s.q.schedule(event{at: ready, kind: evKVReady, node: n.idx, req: r})
	}
	return q, false
}

// kvReady: request r's KV (loaded from the CPU tier or pulled from its prefill node) is in.
func (n *node) kvReady(s *Sim, r int) {
	if q := n.byReq[r]; q != nil {
		q.waitKV = false
		n.kick(s)
	}
}

// endStep applies the step that just ended: tokens out, first tokens, finishes; then the next.
func (n *node) endStep(s *Sim) {
	n.stepping = false
	done := 0
	decoded := 0
	for _, b := range n.batch {
		q := b.s
		if b.decode {
			decoded++
			q.out--
			q.context++
		} else {
			q.prefill -= b.tokens
			q.context += b.tokens
			if q.prefill == 0 {
				n.firstToken(s, q)
			}
		}
		if q.first && q.out <= 0 || q.leg == legPrefill && q.prefill == 0 {
			done++
		}
	}
	s.col.itl(n.stepDur, decoded)
	if done > 0 {
		keep := n.running[:0]
		for _, q := range n.running {
			switch {
			case q.leg == legPrefill && q.prefill == 0:
				n.leased++ // blocks held until the decode node has pulled them
			case q.first && q.out <= 0:
				n.finish(s, q)
			default:
				keep = append(keep, q)
			}
		}
		clear(n.running[len(keep):])
		n.running = keep
	}
	n.startStep(s)
	s.changed(n)
}

// firstToken: q's prompt is computed. The prompt enters the cache; the request's first token is
// out (a prefill leg's answer goes back to its router, which sends the decode leg).
func (n *node) firstToken(s *Sim, q *sequence) {
	_ = q.seq.Insert() // cannot fail: the sequence is neither inserted nor finished
	if q.leg == legPrefill {
		s.prefillAnswered(n, q.req)
		return
	}
	q.first = true
	n.observePull(s, q.req)
	s.firstToken(n, q.req)
}

// finish releases q's blocks; the request is over.
func (n *node) finish(s *Sim, q *sequence) {
	n.release(q)
	s.col.e2e = append(s.col.e2e, seconds(s.q.now-s.trace.Requests[q.req].Arrival))
	s.end(q.req, true)
}

// release finishes q's sequence in the pool and drops it.
func (n *node) release(q *sequence) {
	_ = q.seq.Finish() // cannot fail: each sequence finishes once
	for _, b := range q.blocks {
		if n.held[b]--; n.held[b] == 0 {
			n.active--
		}
	}
	delete(n.byReq, q.req)
}

// endLease frees the blocks of request r's prefill leg once its decode node has pulled them (or
// given up).
func (n *node) endLease(r int) {
	if q := n.byReq[r]; q != nil && q.leg == legPrefill {
		n.release(q)
		n.leased--
	}
}
