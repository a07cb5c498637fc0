package requests

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/prefixmesh/prefixmesh/routing"
)

// PolicyPicker implements Picker over routing.Decider, the router's one decision path (the gRPC
// Route decides through the same Decider): it lists the candidates — alive, not draining,
// serving the model, not excluded, not ejected — and lets the decider estimate, fill in-flight
// load (this router's and its peers') and choose, committing the request as in flight until
// Done and its prefix as pending in the overlay until FirstToken.
type PolicyPicker struct {
	src     NodeSource
	dec     *routing.Decider
	ejected func(string) bool // nil: nothing is ejected
	now     func() time.Time
	disagg  routing.DisaggMode

	scratch sync.Pool // *pickScratch

	wg     sync.WaitGroup // the expiry loop
	cancel context.CancelFunc
}

var _ Picker = (*PolicyPicker)(nil)

// PolicyPickerConfig configures a PolicyPicker.
type PolicyPickerConfig struct {
	// MaxInFlightPerNode is a hard cap on the requests in flight to one node, beyond the
	// policy's bounded-load guard (which is relative to the mean and so never refuses); when
	// every candidate is at the cap Pick answers ErrOverloaded. 0 (default) disables it: the
	// engine's own queue bound (429) is the backstop then. Used by NewPolicyPicker only (a
	// shared Decider carries its own).
	MaxInFlightPerNode int
	// Ejector, when set, takes ejected nodes out of the candidates.
	Ejector Ejector
	// Now is the clock for the overlay; nil means time.Now.
	Now func() time.Time
	// Disaggregate is when a request that allows it (PickRequest.Disaggregable) has its prefill
	// on a prefill node (routing.Decider.PlanPrefill); the zero value is auto. Nothing changes
	// in a fleet without prefill nodes.
	Disaggregate routing.DisaggMode
}

// NewPolicyPicker returns a picker choosing among src's nodes with policy, estimating matches from
// index and overlay (overlay may be nil to disable it), over a Decider of its own.
func NewPolicyPicker(src NodeSource, index *routing.Index, overlay *routing.Overlay, policy routing.Policy, cfg PolicyPickerConfig) (*PolicyPicker, error) {
	if src == nil || index == nil || policy == nil {
		return nil, fmt.Errorf("%w: policy picker needs a node source, an index and a policy", ErrConfig)
	}
	if cfg.MaxInFlightPerNode < 0 {
		return nil, fmt.Errorf("%w: MaxInFlightPerNode %d must not be negative", ErrConfig, cfg.MaxInFlightPerNode)
	}
	d, err := routing.NewDecider(index, overlay, policy, routing.DeciderConfig{MaxInFlightPerNode: cfg.MaxInFlightPerNode})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return NewDeciderPicker(src, d, cfg)
}

// NewDeciderPicker returns a picker over a Decider shared with the router's other paths (gRPC
// Route) and its sharer; cfg.MaxInFlightPerNode is ignored (the decider has its own).
func NewDeciderPicker(src NodeSource, d *routing.Decider, cfg PolicyPickerConfig) (*PolicyPicker, error) {
	if src == nil || d == nil {
		return nil, fmt.Errorf("%w: policy picker needs a node source and a decider", ErrConfig)
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	p := &PolicyPicker{src: src, dec: d, now: now, disagg: cfg.Disaggregate}
	if cfg.Ejector != nil {
		p.ejected = cfg.Ejector.Ejected
	}
	return p, nil
}

// Decider returns the picker's decider.
func (p *PolicyPicker) Decider() *routing.Decider { return p.dec }

// overlayExpireEvery is how often Start's loop drops expired overlay buckets and peer reports: a
// quarter of the overlay TTL, its bucket width, so memory holds little more than one TTL.
const overlayExpireEvery = routing.DefaultOverlayTTL / 4

// Start runs the expiry loop until ctx ends or Close. It does not block. Without it the overlay
// stays bounded (Record expires when full) but holds stale buckets longer.
func (p *PolicyPicker) Start(ctx context.Context) {
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
				p.dec.Expire(p.now())
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

// pickScratch is one decision's working memory, pooled so steady-state picks allocate nothing
// that grows with the prompt.
type pickScratch struct {
	nodes  []routing.NodeInfo
	urls   []string
	choice routing.Choice
	// The prefill pool, listed when the request may be disaggregated.
	pnodes []routing.NodeInfo
	purls  []string
}

// WaitAdmission waits d (a burst's turn: routing.Decider.AdmissionWait), or until ctx ends: a
// cancelled request is decided at once.
func WaitAdmission(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// InFlight returns this router's own requests in flight to node.
func (p *PolicyPicker) InFlight(node string) int { return p.dec.OwnInFlight(node).Requests }

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
func (p *PolicyPicker) Pick(ctx context.Context, req *PickRequest, exclude []string) (Pick, error) {
	dr := routing.DecideRequest{Tokens: req.Tokens, AdapterID: req.AdapterID, Model: req.Model, SessionKey: req.SessionKey}
	sc, _ := p.scratch.Get().(*pickScratch)
	if sc == nil {
		sc = new(pickScratch)
	}
	defer p.scratch.Put(sc)
	// The same eligibility as gRPC Route (routing.Eligibility); pins and a gateway's subset
	// hint come in as req.Allowed (router.PinnedPicker, PickForGateway), the nodes already tried
	// as exclude, the in-flight cap and cold nodes are the decider's.
	el := routing.Eligibility{Model: req.Model, Exclude: exclude, Ejected: p.ejected}
	if req.Allowed != nil {
		el.Allowed = req.Allowed.Has
	}
	if !p.list(sc, &el) {
		return Pick{}, ErrNoNodes
	}
	// When this router has learned that its peers decide in the same instants (bursts) and the
	// burst's other decisions could change this request's choice, the decision waits this router's
	// turn, a few milliseconds, so that the replicas' decisions come one after another and each
	// sees the others' (routing.Decider.AdmissionWait); the nodes are listed again after it.
	if w := p.dec.AdmissionWait(&dr, sc.nodes, p.now(), &sc.choice); w > 0 {
		WaitAdmission(ctx, w)
		if !p.list(sc, &el) {
			return Pick{}, ErrNoNodes
		}
	}
	c := &sc.choice
	if err := p.dec.Decide(&dr, sc.nodes, p.now(), routing.CommitBegin, c); err != nil {
		if errors.Is(err, routing.ErrOverloaded) {
			return Pick{}, ErrOverloaded
		}
		return Pick{}, fmt.Errorf("%w: %w", ErrNoNodes, err)
	}
	t := c.Ticket
	// The front door's first-byte deadline scales with the chosen node's expected TTFT.
	ttft := ExpectedTTFT(&sc.nodes[c.Node], len(req.Tokens)-c.MatchedTokens)
	pk := Pick{
		NodeID:                 sc.nodes[c.Node].ID,
		EngineURL:              sc.urls[c.Node],
		EstimatedMatchedTokens: c.MatchedTokens,
		EstimatedTiers:         c.Tiers,
		Policy:                 p.dec.Policy().Name(),
		Reason:                 c.Reason,
		ExpectedTTFT:           ttft,
	}
	if req.Disaggregable && len(req.Tokens) > 0 {
		if p.disagg != routing.DisaggNever {
			p.planPrefill(&pk, &dr, sc, el)
		}
		if pk.Prefill == nil {
			p.planPeerPull(&pk, &dr, sc)
		}
	}
	if req.Alternates > 0 {
		// A gateway's pick: the fallback list, and accounting that can follow a fallback.
		p.movable(&pk, t, c, sc, req)
		return pk, nil
	}
	pk.Done = func(o Outcome) { t.Done(p.now(), succeeded(o)) }
	pk.FirstToken = func() { t.FirstToken(p.now()) }
	return pk, nil
}

// list fills sc with the eligible nodes and their engine URLs; false when there are none.
func (p *PolicyPicker) list(sc *pickScratch, el *routing.Eligibility) bool {
	sc.nodes, sc.urls = p.appendEligible(sc.nodes[:0], sc.urls[:0], el)
	return len(sc.nodes) > 0
}

// appendEligible appends the nodes el admits and their engine URLs.
func (p *PolicyPicker) appendEligible(nodes []routing.NodeInfo, urls []string, el *routing.Eligibility) ([]routing.NodeInfo, []string) {
	if a, ok := p.src.(NodeAppender); ok {
		return a.AppendEligible(nodes, urls, *el) // by value: a pointer through the interface would escape
	}
	all := p.src.Nodes()
	for i := range all { // by index: a NodeTarget is a few hundred bytes
		if n := &all[i]; el.Eligible(&n.Info) {
			nodes = append(nodes, n.Info)
			urls = append(urls, n.EngineURL)
		}
	}
	return nodes, urls
}

// succeeded is whether a request ended well, for its ticket.
func succeeded(o Outcome) bool { return o.Err == nil && o.Status > 0 && o.Status < 300 }
