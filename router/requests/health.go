package requests

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// HealthConfig configures passive health.
type HealthConfig struct {
	// EjectAfter consecutive failures (connect errors, 5xx) eject a node: 3 tolerates a blip
	// (one request's bad luck and its retry elsewhere) but stops routing to a dead node after
	// the third request, long before gossip's failure detector (seconds) would.
	EjectAfter int
	// Backoff is how long the first ejection lasts unless a probe brings the node back sooner:
	// 5 s, a few probe intervals. Each ejection that follows a failed return doubles it.
	Backoff time.Duration
	// MaxBackoff caps the doubling: 1 min, so a node that recovers without answering probes
	// (probe path blocked) still gets traffic back within a minute.
	MaxBackoff time.Duration
	// ProbeInterval is how often ejected nodes are probed with GET <engine>/v1/models: 1 s, so a
	// recovered node is back within a second.
	ProbeInterval time.Duration
	// ProbeTimeout bounds one probe: 1 s; a healthy engine answers /v1/models in microseconds.
	ProbeTimeout time.Duration
}

// DefaultHealthConfig returns the defaults documented on HealthConfig.
func DefaultHealthConfig() HealthConfig {
	return HealthConfig{EjectAfter: 3, Backoff: 5 * time.Second, MaxBackoff: time.Minute,
		ProbeInterval: time.Second, ProbeTimeout: time.Second}
}

// Validate reports whether the configuration is usable.
func (c HealthConfig) Validate() error {
	switch {
	case c.EjectAfter <= 0:
		return fmt.Errorf("%w: EjectAfter %d must be positive", ErrConfig, c.EjectAfter)
	case c.Backoff <= 0 || c.MaxBackoff < c.Backoff:
		return fmt.Errorf("%w: Backoff %v and MaxBackoff %v must be positive and ordered", ErrConfig, c.Backoff, c.MaxBackoff)
	case c.ProbeInterval <= 0 || c.ProbeTimeout <= 0:
		return fmt.Errorf("%w: ProbeInterval %v and ProbeTimeout %v must be positive", ErrConfig, c.ProbeInterval, c.ProbeTimeout)
	}
	return nil
}

// Health is passive health checking: EjectAfter consecutive failures eject a node at once, for a
// backoff window (doubling on repeated ejections, capped) or until a probe (GET
// <engine>/v1/models answering 200) or the view (MarkHealthy) says it is back. After the window
// the node is half-open: it takes traffic again, and one more failure ejects it again. Outlier
// detection in Envoy works the same way. Safe for concurrent use.
type Health struct {
	cfg    HealthConfig
	src    NodeSource // engine URLs for probes
	client *http.Client
	now    func() time.Time
	onEj   func(nodeID string) // ejection hook (metrics), may be nil
	// onSweep is told the nodes present at each sweep (metrics drop the others), may be nil
	onSweep func(present map[string]bool)

	mu    sync.Mutex // guards nodes
	nodes map[string]*nodeHealth
	// ejected counts the nodes marked ejected (changed under mu): while it is 0, as it is almost
	// always, Ejected answers without the lock, which every decision asks for every candidate.
	ejected atomic.Int64

	wg     sync.WaitGroup
	cancel context.CancelFunc
}

var (
	_ Ejector        = (*Health)(nil)
	_ HealthReporter = (*Health)(nil)
)

type nodeHealth struct {
	fails   int           // consecutive failures
	ejected bool          // out of routing until `until`, a probe or MarkHealthy
	until   time.Time     // end of the current ejection window
	backoff time.Duration // length of the next ejection
}

// NewHealth returns a tracker. src gives the engine URLs to probe; client performs the probes
// (nil: a client with the probe timeout); now is the clock (nil: time.Now).
func NewHealth(cfg HealthConfig, src NodeSource, client *http.Client, now func() time.Time) (*Health, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if client == nil {
		client = &http.Client{Timeout: cfg.ProbeTimeout}
	}
	if now == nil {
		now = time.Now
	}
	return &Health{cfg: cfg, src: src, client: client, now: now, nodes: make(map[string]*nodeHealth)}, nil
}

// OnEject sets a hook called (outside the lock) each time a node is ejected. Call before use.
func (h *Health) OnEject(f func(nodeID string)) { h.onEj = f }

// OnSweep sets a hook called after each Sweep with the ids of the nodes in the view, so that
// per-node state elsewhere (metric series) is dropped with the node. Call before use.
func (h *Health) OnSweep(f func(present map[string]bool)) { h.onSweep = f }

// Sweep forgets the nodes that have left the view (their failure streaks and ejections), so the
// table holds only present nodes however many ids churn through, and tells the OnSweep hook.
// The probe loop calls it every ProbeInterval; tests call it directly.
func (h *Health) Sweep() {
	if h.src == nil {
		return
	}
	present := make(map[string]bool)
	for _, n := range h.src.Nodes() {
		present[n.Info.ID] = true
	}
	h.mu.Lock()
	for id := range h.nodes {
		if !present[id] {
			h.forgetLocked(id)
		}
	}
	h.mu.Unlock()
	if h.onSweep != nil {
		h.onSweep(present)
	}
}

// ReportFailure records a failed attempt; the EjectAfter-th consecutive one ejects the node.
func (h *Health) ReportFailure(nodeID string) {
	h.mu.Lock()
	n := h.nodes[nodeID]
	if n == nil {
		n = &nodeHealth{backoff: h.cfg.Backoff}
		h.nodes[nodeID] = n
	}
	n.fails++
	ejected := false
	if !n.ejected && n.fails >= h.cfg.EjectAfter {
		n.ejected, n.until = true, h.now().Add(n.backoff)
		h.ejected.Add(1)
		n.backoff = min(2*n.backoff, h.cfg.MaxBackoff)
		ejected = true
	}
	h.mu.Unlock()
	if ejected && h.onEj != nil {
		h.onEj(nodeID)
	}
}

// ReportSuccess records a successful attempt: the failure streak ends and the backoff resets.
func (h *Health) ReportSuccess(nodeID string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if n := h.nodes[nodeID]; n != nil && !n.ejected {
		delete(h.nodes, nodeID)
	}
}

// MarkHealthy brings a node back at once (the view learnt it is back, or a probe answered).
func (h *Health) MarkHealthy(nodeID string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.forgetLocked(nodeID)
}

// forgetLocked drops nodeID's health state. Callers hold mu.
func (h *Health) forgetLocked(nodeID string) {
	if n := h.nodes[nodeID]; n != nil && n.ejected {
		h.ejected.Add(-1)
	}
	delete(h.nodes, nodeID)
}

// Ejected reports whether the node is out of routing now. A node whose window has passed is
// half-open: it is routed again and its next failure ejects it again.
func (h *Health) Ejected(nodeID string) bool {
	if h.ejected.Load() == 0 {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	n := h.nodes[nodeID]
	if n == nil || !n.ejected {
		return false
	}
	if h.now().Before(n.until) {
		return true
	}
	n.ejected = false
	h.ejected.Add(-1)
	n.fails = h.cfg.EjectAfter - 1
	return false
}

// EjectedNodes returns the ids of the nodes ejected now.
func (h *Health) EjectedNodes() []string {
	h.mu.Lock()
	var ids []string
	for id, n := range h.nodes {
		if n.ejected {
			ids = append(ids, id)
		}
	}
	h.mu.Unlock()
	var out []string
	for _, id := range ids {
		if h.Ejected(id) {
			out = append(out, id)
		}
	}
	return out
}

// Start runs the probe loop until ctx ends or Close. It does not block.
func (h *Health) Start(ctx context.Context) {
	ctx, h.cancel = context.WithCancel(ctx)
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		t := time.NewTicker(h.cfg.ProbeInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				h.ProbeOnce(ctx)
				h.Sweep()
			}
		}
	}()
}

// Close stops the probe loop and waits for it.
func (h *Health) Close() {
	if h.cancel != nil {
		h.cancel()
	}
	h.wg.Wait()
}

// ProbeOnce probes every ejected node once, in turn, and brings back those that answer. The loop
// calls it every ProbeInterval; tests call it directly.
func (h *Health) ProbeOnce(ctx context.Context) {
	ejected := h.EjectedNodes()
	if len(ejected) == 0 || h.src == nil {
		return
	}
	urls := make(map[string]string, len(ejected))
	for _, n := range h.src.Nodes() {
		urls[n.Info.ID] = n.EngineURL
	}
	for _, id := range ejected {
		u, ok := urls[id]
		if !ok || ctx.Err() != nil {
			continue
		}
		if h.probe(ctx, u) {
			h.MarkHealthy(id)
		}
	}
}

// probe reports whether GET <engine>/v1/models answers 200 within ProbeTimeout.
func (h *Health) probe(ctx context.Context, engineURL string) bool {
	ctx, cancel := context.WithTimeout(ctx, h.cfg.ProbeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, engineURL+"/v1/models", nil)
	if err != nil {
		return false
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}
