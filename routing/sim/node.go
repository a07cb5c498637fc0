package sim

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/prefixmesh/prefixmesh/local"
	"github.com/prefixmesh/prefixmesh/local/kvpool"
)

// node is one simulated GPU node: the node agent's real cache (local.RadixTree) driving a real
// KV block pool (kvpool) exactly as the built-in simulated engine does, plus a continuous
// batching engine model on the virtual clock (see doc.go):
//
//   - arrivals queue FCFS (waiting);
//   - the head is admitted when no prefill is running, fewer than maxConcurrent sequences are
//     running and the pool can hold it (kvpool.Admit: lookup, evict under pressure, allocate);
//     a pool that is busy blocks the head until a sequence finishes;
//   - with a CPU tier (Config.CPUBlocks), the blocks it holds right after the GPU prefix are
//     loaded at the load rate (kvpool.CPUTier.Load, kvpool.Costs.LoadTime) on the prefill
//     stream, before the rest is prefilled, and count as cached, as vLLM counts its connector's
//     tokens;
//   - the uncached tokens are prefilled at the prefill rate, one sequence at a time
//     (kvpool.Costs.PrefillTime); at its end the prompt is inserted into the tree and the first
//     token is out (TTFT);
//   - output tokens are decoded at the per-sequence decode rate (kvpool.Costs.DecodeTime),
//     concurrently with other sequences' prefill and decode; then the sequence finishes and
//     releases its blocks.
//
// With a CPU tier the pool's cache is a kvpool.SpillCache over the tree: the chunks the GPU
// evicts spill into the tier (LRU), the simulated engine's model exactly. The tier's blocks
// reach the routers in the node's summary (summary.go).
type node struct {
	idx   int // position in the fleet
	id    string
	epoch uint64
	tree  *local.RadixTree
	cpu   *kvpool.CPUTier // nil without a CPU tier
	sum   *summary        // what the node publishes: the tree's and the tier's changes
	pool  *kvpool.Pool
	costs kvpool.Costs
	max   int // concurrent sequences (prefilling + decoding)

	waiting    []queued // FCFS
	waitingTok int      // sum of waiting[i].uncached
	seqs       map[int]running

	prefilling    int // request index, -1 when the prefill stream is idle
	prefillTokens int
	prefillStart  time.Duration
	prefillEnd    time.Duration

	// held counts, per pool block, the running sequences using it; active is how many blocks
	// have a nonzero count. A node reports capacity − active as free, as vLLM does: a block
	// that only the cache holds is free to reuse (evictable), not busy.
	held   []int32
	active int

	published   uint64 // journal head already sent to the routers
	lastLoad    load   // the last load report sent
	prefillDone int64  // tokens prefilled (uncached), for the imbalance metric
}

// queued is a waiting request and its uncached tokens as peeked on arrival (the GPU prefix and
// what the CPU tier would load after it are not), which is what the node reports as queued
// prefill work (the engine cannot know the match before admission).
type queued struct {
	req, uncached int
}

// running is an admitted sequence and its block table.
type running struct {
	seq    *kvpool.Seq
	blocks []uint32
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
	return &node{
		idx:   i,
		id:    "node-" + strconv.Itoa(i),
		epoch: uint64(i) + 1,
		tree:  tree,
		cpu:   cpu,
		sum:   newSummary(tree, cpu),
		pool:  pool,
		// A slower node computes slower; its host-to-GPU copies (LoadTokensPerSec) do not.
		costs: kvpool.Costs{PrefillTokensPerSec: cfg.PrefillTokensPerSec * speed, DecodeTokensPerSec: cfg.DecodeTokensPerSec * speed,
			LoadTokensPerSec: cfg.CPULoadTokensPerSec},
		max:        cfg.MaxConcurrent,
		prefilling: -1,
		seqs:       make(map[int]running),
		held:       make([]int32, cfg.BlocksPerNode),
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
	if n.prefilling >= 0 && n.prefillEnd > n.prefillStart {
		left := float64(n.prefillEnd-now) / float64(n.prefillEnd-n.prefillStart)
		queued += int(float64(n.prefillTokens) * left)
	}
	capacity := n.pool.Stats().Blocks
	return load{at: now, running: len(n.seqs), waiting: len(n.waiting), queued: queued,
		freeBlocks: capacity - n.active, capacityBlock: capacity}
}

// enqueue puts request r at the back of the waiting queue.
func (n *node) enqueue(s *Sim, r int) {
	req := &s.trace.Requests[r]
	cached := n.tree.PeekMatchedTokens(req.Tokens, s.cfg.BlockSize, 0)
	if n.cpu != nil {
		cached += n.cpu.Loadable(n.cpu.Peek(req.Tokens, 0, cached))
	}
	q := queued{req: r, uncached: len(req.Tokens) - cached}
	n.waitingTok += q.uncached
	n.waiting = append(n.waiting, q)
}

// tryStart admits waiting requests into the prefill stream while it is idle, a slot is free and
// the pool can hold the head.
func (n *node) tryStart(s *Sim) {
	for n.prefilling < 0 && len(n.waiting) > 0 && len(n.seqs) < n.max {
		r := n.waiting[0].req
		req := &s.trace.Requests[r]
		seq, err := n.pool.Admit(req.Tokens, 0, req.OutputTokens)
		if errors.Is(err, kvpool.ErrPoolBusy) {
			return // head-of-line: wait for a finish to free blocks
		}
		n.waitingTok -= n.waiting[0].uncached
		n.waiting = n.waiting[1:]
		if err != nil { // ErrTooLarge: no amount of waiting makes it fit
			s.reject(n, r)
			continue
		}
		blocks := seq.Blocks()
		for _, b := range blocks {
			if n.held[b]++; n.held[b] == 1 {
				n.active++
			}
		}
		n.seqs[r] = running{seq: seq, blocks: blocks}
		matched, loaded := seq.MatchedTokens(), 0
		if n.cpu != nil {
			// vLLM asks its connector for the tokens past the local hit
			// (get_num_new_matched_tokens) and loads them into the sequence's fresh blocks, which
			// the insert after prefill puts on the GPU; the CPU copy stays.
			loaded = n.cpu.Load(req.Tokens, 0, matched)
		}
		s.admitted(r, matched, loaded)
		n.prefilling = r
		n.prefillTokens = len(req.Tokens) - matched - loaded
		n.prefillStart = s.q.now
		n.prefillEnd = s.q.now + n.costs.LoadTime(loaded) + n.costs.PrefillTime(n.prefillTokens)
		n.prefillDone += int64(n.prefillTokens)
		s.q.schedule(event{at: n.prefillEnd, kind: evPrefillDone, node: n.idx, req: r})
	}
}

// finishPrefill inserts the prompt into the cache and starts decoding.
func (n *node) finishPrefill(s *Sim, r int) {
	_ = n.seqs[r].seq.Insert() // cannot fail: the sequence is neither inserted nor finished
	n.prefilling = -1
	req := &s.trace.Requests[r]
	s.q.schedule(event{at: s.q.now + n.costs.DecodeTime(req.OutputTokens), kind: evFinish, node: n.idx, req: r})
}

// finish releases the sequence's blocks.
func (n *node) finish(r int) {
	run := n.seqs[r]
	_ = run.seq.Finish() // cannot fail: each sequence finishes once
	for _, b := range run.blocks {
		if n.held[b]--; n.held[b] == 0 {
			n.active--
		}
	}
	delete(n.seqs, r)
}
