// Package simengine is the node agent's built-in simulated inference engine (`node
// --engine=sim`, docs/engine-integration.md): an OpenAI-compatible HTTP server that computes nothing but keeps a
// real KV block pool (local/kvpool) driven by the node's local.RadixTree and charges simulated
// time. It runs as a continuous-batching engine, in steps timed by the mixed-batch model
// kvpool.Step (derived from PrefillTokensPerSec and DecodeTokensPerSec by kvpool.FromCosts, with
// TokenBudget tokens a step), the same model and the same scheduling as the trace simulator's
// nodes (routing/sim), so both charge the same time for the same work (step.go). A request is
// tokenised and waits FIFO in a bounded queue; at the start of a step it is admitted into the
// pool (lookup, reuse of the cached prefix, eviction under pressure, allocation of prompt and
// output blocks) when a slot of MaxConcurrent, budget and blocks allow, so it reuses whatever the
// steps before it prefilled. Its uncached tokens are prefilled in chunks, one a step, in steps
// that also carry one token of every decoding sequence: a long prompt slows the streams decoding
// beside it, as on a real GPU. The step that completes its prompt gives its first token and
// inserts the prompt into the cache; it then decodes one token a step up to max_tokens and
// releases its blocks. The output text is deterministic: words drawn by a PRNG
// seeded with the prompt's hash. A LoRA adapter is chosen by model "<Model>:<id>" or the field
// adapter_id (decimal, 0 = base), the adapter id the cache's block hashes are seeded with.
// Responses report the reused tokens as usage.prompt_tokens_details.cached_tokens and in the
// X-Prefixmesh-Cached-Tokens header, which is how the router measures its estimates.
//
// With Config.CPUBlocks set the engine also has a CPU KV tier, as vLLM with its
// OffloadingConnector: the chunks the GPU pool evicts spill into it (kvpool.SpillCache and
// kvpool.CPUTier, the tier the trace simulator's nodes have too), and at admission the run of
// blocks it holds right after the GPU prefix is loaded back into the GPU (the sequence's fresh
// blocks, inserted with the rest of the prompt after prefill) at CPULoadTokensPerSec over the
// node's one host-to-GPU lane, the sequence waiting outside the steps meanwhile, before the
// uncached remainder is prefilled. The
// reported cached_tokens counts the GPU prefix plus the loaded tokens, as vLLM's scheduler sets
// request.num_cached_tokens to the local plus the connector's external computed tokens
// (vllm/v1/core/sched/scheduler.py, schedule()).
//
// With a KV connector (Config.KVSideChannel, on by default) the engine also serves
// prefill/decode disaggregation as vLLM with NixlConnector does, driven by the request's
// kv_transfer_params (kvtransfer.go): a prefill leg leases its blocks and answers where to pull
// them (lease.go), a decode leg pulls what it lacks from that engine's side channel
// (sidechannel.go, pull.go), and any request may pull its prompt's cached blocks from a peer
// (llm-d's remote_kv_source). The request log line and legs_total say which leg a request was.
package simengine

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixmesh/prefixmesh/internal/tokenizer"
	"github.com/prefixmesh/prefixmesh/local"
	"github.com/prefixmesh/prefixmesh/local/kvpool"
)

// Errors of the admission path, mapped to HTTP statuses at the edge (http.go).
var (
	errQueueFull = errors.New("request queue is full")
	errExhausted = errors.New("KV pool exhausted by blocks no running request holds (pinned prefixes)")
	errClosed    = errors.New("engine is not running")
)

// Load is the engine's instantaneous load, which the node agent gossips to routers.
type Load struct {
	Running             int // sequences admitted and not finished
	Waiting             int // requests queued for a slot or for blocks
	FreeBlocks          int // KV blocks with no reference (cached-but-evictable blocks not included)
	QueuedPrefillTokens int // uncached prompt tokens not yet prefilled, admitted or waiting
}

// Engine is the simulated engine. Build it with New, serve Handler, call Start before serving
// and Close to stop.
type Engine struct {
	cfg      Config
	costs    kvpool.Costs // the CPU tier's load rate
	step     kvpool.Step  // the steps' time: kvpool.FromCosts of the rates
	tok      tokenizer.Tokenizer
	cache    *local.RadixTree
	log      *slog.Logger
	met      *metrics
	outVocab []uint32 // single-token words the output is drawn from
	created  int64    // unix seconds, for /v1/models
	ids      atomic.Uint64
	idPrefix uint64           // random per engine: response ids are unique across nodes
	events   *eventPublisher  // nil unless Config.KVEvents.Endpoint is set
	engineID string           // Config.EngineID, or a random one
	kvClient *http.Client     // side-channel calls to other engines
	now      func() time.Time // the leases' clock
	clk      clock            // the steps' clock (step.go): simulated compute, loads, transfers, TTFT
	// leaseKick wakes the lease loop when a lease is added (buffered: a pending kick suffices).
	leaseKick chan struct{}
	// stepKick wakes the step loop when it idles (buffered: a pending kick suffices).
	stepKick chan struct{}
	bg       sync.WaitGroup // the step loop, the lease loop and the side channel's server

	mu             sync.Mutex // guards everything below
	pool           *kvpool.Pool
	cpu            *kvpool.CPUTier    // the CPU tier; nil unless Config.CPUBlocks is set
	spill          *kvpool.SpillCache // the pool's cache when cpu is set
	running        int                // tickets admitted and not released (their slots)
	queue          []*waiter          // FIFO of requests waiting for admission: a step, a slot, blocks
	seqs           []*ticket          // the running sequences the steps carry, in admission order
	batch          []scheduled        // the step under way (step.go)
	loadFree       time.Time          // when the host-to-GPU lane (CPU-tier loads) is free
	pendingPrefill int                // Load.QueuedPrefillTokens
	started        bool
	closed         bool
	ctx            context.Context // the engine's lifetime, set by Start
	cancel         context.CancelFunc
	inflight       sync.WaitGroup    // generation requests; Add under mu while !closed
	leases         map[string]*lease // by remote_request_id
	sideLis        net.Listener      // the side channel; nil without a KV connector
	sideSrv        *http.Server
	sideHost       string // advertised as remote_host
	sidePort       int    // advertised as remote_port
}

// admission is what a request asks of the pool and the steps: blocks for its prompt and out
// output tokens, want tokens produced and, when it pulls KV after admission (pull.go), that its
// cost be charged only once the pull is known (deferCharge).
type admission struct {
	tokens      []uint32
	adapter     uint64
	out         int
	want        int
	deferCharge bool
}

// waiter is a queued request; ready is closed once tk or err is set.
type waiter struct {
	admission
	est   int // its share of pendingPrefill while queued: prompt − peeked cached tokens
	ready chan struct{}
	tk    *ticket
	err   error
}

// ticket is an admitted request: its sequence, its slot and its progress through the steps.
type ticket struct {
	seq      *kvpool.Seq
	tokens   []uint32
	adapter  uint64
	want     int // output tokens to produce (max_tokens)
	cached   int // reported cached_tokens: local.EngineCachedTokens of the reused prefix
	loaded   int // of cached, the tokens loaded from the CPU tier
	uncached int // prompt tokens prefilled: the rest, the recomputed last block included
	pulled   int // of cached, the tokens pulled from another engine (pull.go)
	// notify wakes the request's handler when the steps have produced a token (buffered: one
	// pending wake-up suffices, the handler reads produced).
	notify chan struct{}

	// Guarded by Engine.mu:
	prefill   int       // prompt tokens still to compute, counted in pendingPrefill
	context   int       // tokens in its KV
	produced  int       // output tokens out of the steps, the first included
	prefilled bool      // its prompt is computed and inserted into the cache
	waitKV    bool      // its KV is loading or being pulled: the steps skip it
	kvReadyAt time.Time // when the load and transfer charged for it end (chargeLocked)
	gone      bool      // released or leased: out of the steps
	leased    bool      // the sequence now belongs to a lease, not to release
}

// doneLocked reports whether the steps have produced all its tokens. e.mu is held.
func (tk *ticket) doneLocked() bool { return tk.prefilled && tk.produced >= tk.want }

// New builds an engine over cache, which must be the node's tree and must not be evicted from or
// inserted into by anyone else (the pool applies the block references those calls return). The
// metrics are registered on reg when it is not nil.
func New(cfg Config, cache *local.RadixTree, logger *slog.Logger, reg *prometheus.Registry) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cache == nil {
		return nil, fmt.Errorf("%w: nil cache", ErrConfig)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	tok, err := tokenizer.New(cfg.Tokenizer)
	if err != nil {
		return nil, fmt.Errorf("simengine: %w", err)
	}
	var (
		pc    local.PrefixCache = cache
		cpu   *kvpool.CPUTier
		spill *kvpool.SpillCache
	)
	if cfg.CPUBlocks > 0 {
		if cpu, err = kvpool.NewCPUTier(cfg.CPUBlocks, cfg.CPUChunkBlocks, cfg.BlockSize); err != nil {
			return nil, fmt.Errorf("simengine: %w", err)
		}
		if spill, err = kvpool.NewSpillCache(cache, cpu, cfg.KVBlocks, cfg.BlockSize); err != nil {
			return nil, fmt.Errorf("simengine: %w", err)
		}
		pc = spill
	}
	pool, err := kvpool.New(pc, cfg.KVBlocks, cfg.BlockSize)
	if err != nil {
		return nil, fmt.Errorf("simengine: %w", err)
	}
	id := cfg.EngineID
	if id == "" {
		id = randomID()
	}
	e := &Engine{
		engineID:  id,
		kvClient:  &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 16}},
		now:       time.Now,
		clk:       wallClock{},
		leaseKick: make(chan struct{}, 1),
		stepKick:  make(chan struct{}, 1),
		leases:    make(map[string]*lease),
		cfg:       cfg,
		costs:     cfg.costs(),
		step:      cfg.step(),
		tok:       tok,
		cache:     cache,
		log:       logger,
		outVocab:  outputVocab(tok),
		created:   time.Now().Unix(),
		idPrefix:  mrand.Uint64(),
		pool:      pool,
		cpu:       cpu,
		spill:     spill,
	}
	if e.met, err = newMetrics(e, reg); err != nil {
		return nil, fmt.Errorf("simengine: register metrics: %w", err)
	}
	return e, nil
}

// Start lets the engine serve; requests before Start or after Close get 503. Cancelling ctx
// aborts every request in flight. Start does not block; with KV events configured it binds the
// publisher's sockets, whose goroutines Close stops.
func (e *Engine) Start(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.started || e.closed {
		return nil
	}
	var side net.Listener
	if e.cfg.KVSideChannel != "" {
		var err error
		if side, err = net.Listen("tcp", e.cfg.KVSideChannel); err != nil {
			return fmt.Errorf("simengine: kv side channel: %w", err)
		}
	}
	if e.cfg.KVEvents.Endpoint != "" {
		ev, err := newEventPublisher(ctx, e.cfg.KVEvents, e.cache, e.cfg.BlockSize, e.log)
		if err != nil {
			if side != nil {
				_ = side.Close()
			}
			return fmt.Errorf("simengine: %w", err)
		}
		e.events = ev
		if e.cpu != nil {
			e.cpu.SetRecording(true)
		}
	}
	if side != nil {
		e.serveSideChannel(side)
	}
	e.started = true
	e.ctx, e.cancel = context.WithCancel(ctx)
	e.bg.Add(2)
	go e.stepLoop(e.ctx)
	go e.leaseLoop(e.ctx)
	sideAddr := ""
	if e.sideLis != nil {
		sideAddr = net.JoinHostPort(e.sideHost, strconv.Itoa(e.sidePort))
	}
	e.log.Info("simulated engine started", "model", e.cfg.Model, "kv_blocks", e.cfg.KVBlocks,
		"block_size", e.cfg.BlockSize, "cpu_blocks", e.cfg.CPUBlocks, "cpu_chunk_blocks", e.cfg.CPUChunkBlocks,
		"tokenizer", e.cfg.Tokenizer, "kv_events", e.KVEventsAddr(), "engine_id", e.engineID,
		"kv_side_channel", sideAddr, "kv_lease", e.cfg.KVLeaseDuration, "kv_load_failure_policy", e.cfg.KVLoadFailurePolicy)
	return nil
}

// EngineID is the id other engines know this one by (remote_engine_id).
func (e *Engine) EngineID() string { return e.engineID }

// randomID is a random 128-bit id in uuid4's text form, as vLLM's default engine_id.
func randomID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	b[6], b[8] = b[6]&0x0f|0x40, b[8]&0x3f|0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// KVEventsAddr is the bound KV-event PUB endpoint ("" when not publishing).
func (e *Engine) KVEventsAddr() string {
	if e.events == nil {
		return ""
	}
	return e.events.pub.Addr()
}

// kvEventsDropped is the publisher's Dropped count (0 when not publishing).
func (e *Engine) kvEventsDropped() uint64 {
	e.mu.Lock()
	ev := e.events
	e.mu.Unlock()
	if ev == nil {
		return 0
	}
	return ev.pub.Dropped()
}

// KVEventsReplayAddr is the bound replay endpoint ("" when not serving replay).
func (e *Engine) KVEventsReplayAddr() string {
	if e.events == nil {
		return ""
	}
	return e.events.pub.ReplayAddr()
}

// Close aborts the requests in flight, waits until each has released its blocks and stops
// serving. Every wait in a request watches the engine's context, so Close returns promptly.
func (e *Engine) Close() {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return
	}
	e.closed = true
	if e.cancel != nil {
		e.cancel()
	}
	e.mu.Unlock()
	e.inflight.Wait()
	if e.sideSrv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), sideChannelShutdown)
		if err := e.sideSrv.Shutdown(ctx); err != nil {
			_ = e.sideSrv.Close()
		}
		cancel()
	}
	e.bg.Wait() // the step and lease loops (their context is cancelled) and the side channel's server
	e.mu.Lock()
	e.releaseAllLeasesLocked()
	e.mu.Unlock()
	e.kvClient.CloseIdleConnections()
	if e.events != nil {
		e.events.pub.Close()
	}
}

// Load returns the current load.
func (e *Engine) Load() Load {
	e.mu.Lock()
	defer e.mu.Unlock()
	return Load{
		Running:             e.running,
		Waiting:             len(e.queue),
		FreeBlocks:          e.pool.Stats().Free,
		QueuedPrefillTokens: e.pendingPrefill,
	}
}

// PoolStats returns the KV pool's counters.
func (e *Engine) PoolStats() kvpool.Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.pool.Stats()
}

// begin registers a generation request; it fails once the engine is closed or not started.
func (e *Engine) begin() (context.Context, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.started || e.closed || e.ctx.Err() != nil {
		return nil, errClosed
	}
	e.inflight.Add(1)
	return e.ctx, nil
}

// acquire queues the request for admission into the pool, which the step loop does at the start
// of a step when a slot, budget and blocks allow (step.go), and waits for it. The returned
// ticket must be given back with release.
//
// While it waits, keepAlive (when not nil) runs every keepAliveEvery: a decode leg renews its
// prefill engine's lease with it.
func (e *Engine) acquire(ctx context.Context, a admission, keepAlive func(), keepAliveEvery time.Duration) (*ticket, error) {
	tokens, adapter, out := a.tokens, a.adapter, a.out
	e.mu.Lock()
	if !e.pool.Fits(len(tokens), out) {
		e.mu.Unlock()
		return nil, fmt.Errorf("%w: %d prompt + %d output tokens need %d blocks of %d, the pool has %d",
			kvpool.ErrTooLarge, len(tokens), out, e.pool.BlocksFor(len(tokens), out), e.cfg.BlockSize, e.cfg.KVBlocks)
	}
	// The requests a free slot will take at the next step wait for that step only, not for a
	// slot or blocks: MaxQueue counts the others.
	if len(e.queue) >= e.cfg.MaxQueue+max(e.cfg.MaxConcurrent-e.running, 0) {
		e.mu.Unlock()
		return nil, errQueueFull
	}
	w := &waiter{admission: a, ready: make(chan struct{})}
	gpu, cpu := e.peekTiersLocked(tokens, adapter)
	if e.cpu != nil {
		cpu = e.cpu.Loadable(cpu)
	}
	w.est = len(tokens) - gpu - cpu
	e.pendingPrefill += w.est
	e.queue = append(e.queue, w)
	e.kickLocked()
	e.mu.Unlock()

	var tick <-chan time.Time
	if keepAlive != nil {
		t := time.NewTicker(keepAliveEvery)
		defer t.Stop()
		tick = t.C
	}
wait:
	for {
		select {
		case <-w.ready:
			return w.tk, w.err
		case <-ctx.Done():
			break wait
		case <-tick:
			keepAlive()
		}
	}
	e.mu.Lock()
	select {
	case <-w.ready: // granted while we were giving up: hand it back
		e.mu.Unlock()
		if w.tk != nil {
			e.release(w.tk)
		}
	default:
		if i := slices.Index(e.queue, w); i >= 0 {
			e.queue = slices.Delete(e.queue, i, i+1)
		}
		e.pendingPrefill -= w.est
		e.kickLocked() // the head may have left: the next one may fit
		e.mu.Unlock()
	}
	return nil, ctx.Err()
}

// admitLocked admits into the pool; the step loop calls it at the start of a step, so the lookup
// sees every prompt the steps before have completed. Unless the request pulls KV first
// (deferCharge; pull.go settles it), its cost is charged now. e.mu is held.
func (e *Engine) admitLocked(a admission) (*ticket, error) {
	tokens, adapter, out := a.tokens, a.adapter, a.out
	seq, err := e.pool.Admit(tokens, adapter, out)
	e.publishLocked(nil, 0) // the reclaim may have evicted blocks, even when admission failed
	if err != nil {
		return nil, err
	}
	e.running++
	bs := e.cfg.BlockSize
	cached := local.EngineCachedTokens(seq.MatchedTokens(), len(tokens), bs)
	loaded := 0
	if e.cpu != nil {
		// vLLM asks its connector for the tokens beyond the local hit
		// (get_num_new_matched_tokens(request, num_new_local_computed_tokens)) and counts both.
		cont := e.cpu.Load(tokens, adapter, seq.MatchedTokens())
		withCPU := local.EngineCachedTokens(seq.MatchedTokens()+cont, len(tokens), bs)
		loaded, cached = withCPU-cached, withCPU
	}
	tk := &ticket{seq: seq, tokens: tokens, adapter: adapter, want: a.want, cached: cached, loaded: loaded,
		uncached: len(tokens) - cached, notify: make(chan struct{}, 1)}
	e.setPrefillLocked(tk)
	e.seqs = append(e.seqs, tk)
	if a.deferCharge {
		tk.waitKV = true // until pull.go has settled what it moved
	} else {
		e.chargeLocked(tk, 0)
	}
	return tk, nil
}

// setPrefillLocked sets the prompt tokens tk still has to compute from tk.uncached (at least
// one: vLLM always computes the prompt's last token, whose logits give the first output token),
// keeping pendingPrefill their sum. e.mu is held.
func (e *Engine) setPrefillLocked(tk *ticket) {
	e.pendingPrefill -= tk.prefill
	tk.prefill = max(tk.uncached, 1)
	tk.context = len(tk.tokens) - tk.prefill
	e.pendingPrefill += tk.prefill
}

// chargeLocked settles what the request costs before its prefill: the CPU-tier load, on the
// node's one host-to-GPU lane, then transfer (tokens pulled from another engine). Until both
// are done the sequence waits outside the steps (waitKV; the handler's awaitKV ends the wait);
// its uncached rest is then computed in the steps. e.mu is held.
func (e *Engine) chargeLocked(tk *ticket, transfer time.Duration) {
	load := e.costs.LoadTime(tk.loaded)
	now := e.clk.Now()
	ready := now
	if load > 0 {
		e.loadFree = maxTime(now, e.loadFree).Add(load)
		ready = e.loadFree
	}
	ready = ready.Add(transfer)
	tk.waitKV, tk.kvReadyAt = ready.After(now), ready
	e.met.promptTokens.Add(float64(len(tk.tokens)))
	e.met.cachedTokens.Add(float64(tk.cached))
	e.met.cpuLoadedTokens.Add(float64(tk.loaded))
	e.met.prefillTokens.Add(float64(tk.uncached))
	e.met.loadSeconds.Add(load.Seconds())
	e.met.transferSeconds.Add(transfer.Seconds())
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// awaitKV waits out tk's load and transfer (chargeLocked), then lets the steps take it.
func (e *Engine) awaitKV(ctx context.Context, tk *ticket) error {
	e.mu.Lock()
	wait, at := tk.waitKV, tk.kvReadyAt
	e.mu.Unlock()
	if !wait {
		return nil
	}
	if err := e.clk.SleepUntil(ctx, at); err != nil {
		return err
	}
	e.mu.Lock()
	tk.waitKV = false
	e.kickLocked()
	e.mu.Unlock()
	return nil
}

// blocksWillFreeLocked reports whether blocks held now will be freed without anyone asking:
// running sequences finish and leases are pulled or expire. When neither holds any, a request
// that does not fit never will, and fails rather than blocks the queue. e.mu is held.
func (e *Engine) blocksWillFreeLocked() bool { return e.running > 0 || len(e.leases) > 0 }

// peekTiersLocked is what a lookup of the prompt would find now, without taking anything: the
// tokens of the GPU prefix, and how far the CPU tier continues it block by block (0 without
// one). These are the two numbers a mirror of the engine's events answers with
// (kvevents.CacheMirror.PeekMatchedTokensByTier). e.mu is held.
func (e *Engine) peekTiersLocked(tokens []uint32, adapter uint64) (gpu, cpu int) {
	gpu = e.cache.PeekMatchedTokens(tokens, e.cfg.BlockSize, adapter)
	if e.cpu != nil {
		cpu = e.cpu.Peek(tokens, adapter, gpu)
	}
	return gpu, cpu
}

// TierStats are the CPU tier's level and counters.
type TierStats struct {
	CPUBlocks   int    // GPU-sized blocks the CPU tier holds
	Stored      uint64 // chunks spilled into it
	Evicted     uint64 // chunks it evicted (LRU)
	Unspillable uint64 // chunks whose blocks no longer held their chain (0 while the pool is the tree's only writer)
}

// TierStats returns the CPU tier's counters (zero without one).
func (e *Engine) TierStats() TierStats {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cpu == nil {
		return TierStats{}
	}
	st := e.cpu.Stats()
	return TierStats{CPUBlocks: st.Blocks, Stored: st.Stored, Evicted: st.Evicted, Unspillable: e.spill.Unspillable()}
}

// awaitToken waits until the steps have produced tk's output token i (0-based) or ctx ends.
func (e *Engine) awaitToken(ctx context.Context, tk *ticket, i int) error {
	for {
		e.mu.Lock()
		ok := tk.produced > i
		e.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-tk.notify:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// release finishes the sequence, returns its blocks and lets the queue move (a no-op for a
// ticket whose sequence went to a lease). A sequence cut short leaves the steps here.
func (e *Engine) release(tk *ticket) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if tk.leased {
		return
	}
	e.removeSeqLocked(tk)
	e.pendingPrefill -= tk.prefill // what a sequence cut short never computed
	tk.prefill = 0
	if err := tk.seq.Finish(); err != nil {
		e.log.Error("kv pool finish", "err", err) // unreachable: a ticket is released once
	}
	e.running--
	e.kickLocked()
}

// outputTokens is the deterministic completion of a prompt: n tokens drawn from outVocab by a
// PRNG seeded with the prompt's hash (under its adapter's seed).
func (e *Engine) outputTokens(tokens []uint32, adapter uint64, n int) []uint32 {
	seed := local.ChainHash(local.AdapterSeed(adapter), tokens)
	rng := mrand.New(mrand.NewPCG(seed, 0x70726566))
	out := make([]uint32, n)
	for i := range out {
		out[i] = e.outVocab[rng.IntN(len(e.outVocab))]
	}
	return out
}

// outputWords are candidate output tokens; those the tokenizer encodes as one token that decodes
// back to the word are used, so every output token decodes to a whole, valid word.
var outputWords = []string{" the", " prefix", " cache", " block", " token", " node", " router",
	" of", " and", " to", " in", " is", " a", " fast", " warm", " cold", " hit", " miss", ".", ","}

func outputVocab(tok tokenizer.Tokenizer) []uint32 {
	var v []uint32
	for _, w := range outputWords {
		if ids := tok.Encode(w); len(ids) == 1 && tok.Decode(ids) == w {
			v = append(v, ids[0])
		}
	}
	if len(v) < 8 { // a byte-level tokenizer: use letters and spaces
		v = v[:0]
		for _, w := range "abcdefghijklmnopqrstuvwxyz    " {
			if ids := tok.Encode(string(w)); len(ids) == 1 {
				v = append(v, ids[0])
			}
		}
	}
	return v
}
