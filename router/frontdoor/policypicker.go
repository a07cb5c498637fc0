package frontdoor

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prefixmesh/prefixmesh/local"
	"github.com/prefixmesh/prefixmesh/routing"
)

// PolicyPicker implements Picker over the pure routing pieces: a node list, the summary index, the
// in-flight overlay and a policy. For each request it computes the prompt's canonical block hashes
// (once per distinct block size among the candidates), estimates each candidate's matched tokens
// as max(index, overlay) × block size, fills the router's own in-flight counts into the nodes'
// load, and lets the policy choose. The chosen node's in-flight count, prompt tokens and uncached
// prefill tokens are added under one lock with the decision, so concurrent requests see each
// other's load; the request's hashes are recorded in the overlay as expected on the node. Done
// (and FirstToken, for the prefill part) take them back.
type PolicyPicker struct {
	src     NodeSource
	index   *routing.Index
	overlay *routing.Overlay
	policy  routing.Policy
	ejector Ejector // nil: nothing is ejected
	maxPer  int     // hard in-flight cap per node, 0 = none
	now     func() time.Time

	mu   sync.Mutex // guards load and serializes policy decisions with the load they saw
	load map[string]*nodeLoad

	scratch sync.Pool // *pickScratch

	wg     sync.WaitGroup // the overlay expiry loop
	cancel context.CancelFunc
}

var _ Picker = (*PolicyPicker)(nil)

// nodeLoad is the router's own load on one node.
type nodeLoad struct {
	inflight, tokens, prefill int
}

// PolicyPickerConfig configures a PolicyPicker.
type PolicyPickerConfig struct {
	// MaxInFlightPerNode is a hard cap on this router's requests in flight to one node, beyond
	// the policy's bounded-load guard (which is relative to the mean and so never refuses);
	// when every candidate is at the cap Pick answers ErrOverloaded. 0 (default) disables it:
	// the engine's own queue bound (429) is the backstop then.
	MaxInFlightPerNode int
	// Ejector, when set, takes ejected nodes out of the candidates.
	Ejector Ejector
	// Now is the clock for the overlay; nil means time.Now.
	Now func() time.Time
}

// NewPolicyPicker returns a picker choosing among src's nodes with policy, estimating matches from
// index and overlay (overlay may be nil to disable it).
func NewPolicyPicker(src NodeSource, index *routing.Index, overlay *routing.Overlay, policy routing.Policy, cfg PolicyPickerConfig) (*PolicyPicker, error) {
	if src == nil || index == nil || policy == nil {
		return nil, fmt.Errorf("%w: policy picker needs a node source, an index and a policy", ErrConfig)
	}
	if cfg.MaxInFlightPerNode < 0 {
		return nil, fmt.Errorf("%w: MaxInFlightPerNode %d must not be negative", ErrConfig, cfg.MaxInFlightPerNode)
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	return &PolicyPicker{src: src, index: index, overlay: overlay, policy: policy, ejector: cfg.Ejector,
		maxPer: cfg.MaxInFlightPerNode, now: now, load: make(map[string]*nodeLoad)}, nil
}

// overlayExpireEvery is how often Start's loop drops expired overlay buckets: a quarter of the
// overlay TTL, its bucket width, so memory holds little more than one TTL of records.
const overlayExpireEvery = routing.DefaultOverlayTTL / 4

// Start runs the overlay's expiry loop until ctx ends or Close. It does not block. Without it the
// overlay stays bounded (Record expires when full) but holds stale buckets longer.
func (p *PolicyPicker) Start(ctx context.Context) {
	if p.overlay == nil {
		return
	}
	ctx, p.cancel = context.WithCancel(ctx)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(overlayExpireEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				p.overlay.Expire(p.now())
			}
		}
	}()
}

// Close stops the expiry loop and waits for it.
func (p *PolicyPicker) Close() {
	if p.cancel != nil {
		p.cancel()
	}
	p.wg.Wait()
}

// pickScratch is one decision's working memory, pooled so steady-state picks allocate little.
type pickScratch struct {
	nodes   []routing.NodeInfo
	urls    []string
	ids     []string
	blocks  []int
	matched []int
	hashes  []uint64
	dec     routing.Decision
}

// InFlight returns this router's requests in flight to node.
func (p *PolicyPicker) InFlight(node string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if l := p.load[node]; l != nil {
		return l.inflight
	}
	return 0
}

// Models returns the union of the models of the nodes that are alive, sorted.
func (p *PolicyPicker) Models() []string {
	var out []string
	for _, n := range p.src.Nodes() {
		if n.Info.Alive && n.Info.Model != "" && !slices.Contains(out, n.Info.Model) {
			out = append(out, n.Info.Model)
		}
	}
	slices.Sort(out)
	return out
}

// Pick implements Picker.
func (p *PolicyPicker) Pick(_ context.Context, req *PickRequest, exclude []string) (Pick, error) {
	sc, _ := p.scratch.Get().(*pickScratch)
	if sc == nil {
		sc = new(pickScratch)
	}
	defer p.scratch.Put(sc)
	sc.nodes, sc.urls, sc.ids = sc.nodes[:0], sc.urls[:0], sc.ids[:0]
	atCap := false
	for _, n := range p.src.Nodes() {
		in := &n.Info
		if !in.Alive || in.Draining || (req.Model != "" && in.Model != req.Model) ||
			slices.Contains(exclude, in.ID) || (p.ejector != nil && p.ejector.Ejected(in.ID)) {
			continue
		}
		sc.nodes = append(sc.nodes, *in)
		sc.urls = append(sc.urls, n.EngineURL)
		sc.ids = append(sc.ids, in.ID)
	}
	if len(sc.nodes) == 0 {
		return Pick{}, ErrNoNodes
	}

	// Estimates, outside the lock: hashes per block size (a fleet normally has one).
	now := p.now()
	sc.matched = grow(sc.matched, len(sc.nodes))
	sc.blocks = grow(sc.blocks, len(sc.nodes))
	bs0 := blockSizeOf(&sc.nodes[0])
	// Fast path and the common case: one block size. Nodes with another block size get their
	// own hash chain below.
	sc.hashes = local.AppendBlockHashes(sc.hashes[:0], req.Tokens, bs0, req.AdapterID)
	p.estimate(sc.hashes, sc.ids, sc.blocks, now)
	for i := range sc.nodes {
		sc.matched[i] = sc.blocks[i] * bs0
	}
	reqHashes := sc.hashes
	for i := range sc.nodes {
		if bs := blockSizeOf(&sc.nodes[i]); bs != bs0 {
			h := local.BlockHashes(req.Tokens, bs, req.AdapterID)
			var b [1]int
			p.estimate(h, sc.ids[i:i+1], b[:], now)
			sc.matched[i] = b[0] * bs
		}
	}

	rq := routing.Request{Hashes: reqHashes, PromptTokens: len(req.Tokens), AdapterID: req.AdapterID,
		Model: req.Model, SessionKey: req.SessionKey, BlockSize: bs0}

	p.mu.Lock()
	// The router's own load, fresh, replaces whatever the source reported for it.
	k := 0
	for i := range sc.nodes {
		l := p.load[sc.nodes[i].ID]
		if l != nil {
			sc.nodes[i].InFlight, sc.nodes[i].InFlightTokens, sc.nodes[i].InFlightPrefillTokens = l.inflight, l.tokens, l.prefill
		}
		if p.maxPer > 0 && sc.nodes[i].InFlight >= p.maxPer {
			atCap = true
			continue
		}
		sc.nodes[k], sc.urls[k], sc.ids[k], sc.matched[k] = sc.nodes[i], sc.urls[i], sc.ids[i], sc.matched[i]
		k++
	}
	sc.nodes, sc.urls, sc.ids, sc.matched = sc.nodes[:k], sc.urls[:k], sc.ids[:k], sc.matched[:k]
	if k == 0 {
		p.mu.Unlock()
		if atCap {
			return Pick{}, ErrOverloaded
		}
		return Pick{}, ErrNoNodes
	}
	if err := p.policy.Choose(&rq, sc.nodes, sc.matched, now, &sc.dec); err != nil {
		p.mu.Unlock()
		return Pick{}, fmt.Errorf("%w: %w", ErrNoNodes, err)
	}
	if allInf(sc.dec.Candidates) {
		p.mu.Unlock()
		return Pick{}, ErrOverloaded
	}
	chosen := sc.dec.Node
	id := sc.nodes[chosen].ID
	// issue 11: the estimate is what the engine will report as cached_tokens (vLLM's rule: a
	// fully cached prompt recomputes its last token), applied once, in local.
	matched := local.EngineCachedTokens(sc.dec.MatchedTokens, len(req.Tokens), blockSizeOf(&sc.nodes[chosen]))
	prefill := max(0, len(req.Tokens)-matched)
	l := p.load[id]
	if l == nil {
		l = &nodeLoad{}
		p.load[id] = l
	}
	l.inflight++
	l.tokens += len(req.Tokens)
	l.prefill += prefill
	p.mu.Unlock()

	// The prefix is pending on the chosen node from now until its first token (End) or failure
	// (Abort): a request queued longer than the overlay's TTL must not hide its prefix from the
	// next routing decisions, and a failed one must not advertise it at all.
	var pending []uint64
	if p.overlay != nil {
		h := reqHashes
		if bs := blockSizeOf(&sc.nodes[chosen]); bs != bs0 {
			h = local.BlockHashes(req.Tokens, bs, req.AdapterID)
		}
		pending = append([]uint64(nil), h...) // sc's buffer is reused once Pick returns
		p.overlay.Begin(id, pending, now)
	}
	var done, first atomic.Bool
	tokens := len(req.Tokens)
	release := func(firstOnly, ok bool) {
		p.mu.Lock()
		firstTime := !first.Swap(true)
		if l := p.load[id]; l != nil {
			if firstTime {
				l.prefill -= prefill
			}
			if !firstOnly {
				l.inflight--
				l.tokens -= tokens
				if l.inflight == 0 {
					delete(p.load, id)
				}
			}
		}
		p.mu.Unlock()
		if firstTime && p.overlay != nil {
			if ok {
				p.overlay.End(id, pending, p.now())
			} else {
				p.overlay.Abort(id, pending)
			}
		}
	}
	return Pick{
		NodeID:                 id,
		EngineURL:              sc.urls[chosen],
		EstimatedMatchedTokens: matched,
		Policy:                 p.policy.Name(),
		Reason:                 sc.dec.Reason,
		Done: func(o Outcome) {
			if !done.Swap(true) {
				release(false, o.Err == nil && o.Status > 0 && o.Status < 300)
			}
		},
		FirstToken: func() {
			if !done.Load() {
				release(true, true)
			}
		},
	}, nil
}

// estimate writes max(index, overlay) matched blocks per node into blocks.
func (p *PolicyPicker) estimate(hashes []uint64, ids []string, blocks []int, now time.Time) {
	p.index.Estimate(hashes, ids, blocks)
	if p.overlay != nil {
		p.overlay.Estimate(hashes, ids, blocks, now)
	}
}

// blockSizeOf is the node's block size, 16 (vLLM's default) when it did not report one.
func blockSizeOf(n *routing.NodeInfo) int {
	if n.BlockSize > 0 {
		return n.BlockSize
	}
	return 16
}

// allInf reports whether a policy marked every candidate as excluded by its load guard.
func allInf(c []routing.Candidate) bool {
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

func grow[T any](b []T, n int) []T {
	if cap(b) < n {
		return make([]T, n)
	}
	return b[:n]
}
