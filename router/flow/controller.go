package flow

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixmesh/prefixmesh/internal/openai"
)

// Request headers (and gRPC metadata keys, lower-cased) that carry a request's class and tenant.
const (
	HeaderPriority = "X-Prefixmesh-Priority"
	HeaderTenant   = "X-Prefixmesh-Tenant"
	// HeaderDroppedReason is on every answer flow control sheds: a Reason.
	HeaderDroppedReason = "X-Prefixmesh-Dropped-Reason"
)

// TenantHeaders are read in this order for a request's tenant: the router's own header, then
// llm-d's fairness id and its former name, so requests through an llm-d gateway keep their
// tenants.
var TenantHeaders = [...]string{HeaderTenant, "X-Llm-D-Inference-Fairness-Id", "X-Gateway-Inference-Fairness-Id"}

// TenantOf is the request's tenant from its headers (TenantHeaders, the first present).
func TenantOf(h http.Header) string {
	for _, k := range TenantHeaders {
		if v := h.Get(k); v != "" {
			return v
		}
	}
	return ""
}

// Admitter is what a door calls: Controller implements it.
type Admitter interface {
	Admit(ctx context.Context, r Request) (release func(), err error)
}

var _ Admitter = (*Controller)(nil)

// RetryAfterSeconds is the Retry-After of a shed request: the doors' own default
// (internal/openai), as capacity frees as requests complete, within seconds.
const RetryAfterSeconds = openai.DefaultRetryAfter

// maxTenantBytes bounds a tenant key: a queue holds at most Limits.MaxTotal of them.
const maxTenantBytes = 128

// ErrNoNodes is Admit's answer when no node serves the request's model: the doors answer it as
// they answer a decision with no candidate (503).
var ErrNoNodes = errors.New("flow: no node can serve this request")

// ShedError is Admit's answer for a request flow control sheds (429 with Retry-After and
// HeaderDroppedReason; gRPC ResourceExhausted).
type ShedError struct {
	Class  Class
	Reason Reason
}

func (e *ShedError) Error() string {
	switch e.Reason {
	case ReasonWaitTimeout:
		return fmt.Sprintf("the fleet is saturated and this %s request waited its limit in the router's queue; retry later", e.Class)
	case ReasonDisplaced:
		return fmt.Sprintf("the fleet is saturated and this %s request gave its place in the router's queue to a more important one; retry later", e.Class)
	}
	return fmt.Sprintf("the fleet is saturated and the router's queue for %s requests is full; retry later", e.Class)
}

// Request is what flow control knows of a request.
type Request struct {
	// Model is the base model ("": any node); saturation is read over the nodes serving it.
	Model string
	// Priority is the request's class name as it came (HeaderPriority); "" or a name ParseClass
	// does not know gives the model's default class (Config.ModelClasses), else Standard.
	Priority string
	// Tenant is the fairness key (TenantHeaders); "" is a tenant of its own.
	Tenant string
}

// Source is the router's view of the nodes, as saturation reads it.
type Source interface {
	// AppendLoads appends the load of every node that serves model (every node when model is
	// "") and takes requests (alive, not draining).
	AppendLoads(dst []NodeLoad, model string) []NodeLoad
}

// Config configures a Controller.
type Config struct {
	Limits     Limits
	Thresholds Thresholds
	// ModelClasses is each model's default class, for requests that name none.
	ModelClasses map[string]Class
	// Recheck is the longest time between two reads of the view while the controller runs:
	// it keeps the fast path's headroom fresh, notices stale reports and releases queued
	// requests when load reports (not completions) free capacity. Default 50 ms, a quarter of
	// the nodes' longest report interval.
	Recheck time.Duration
	// MaxModels bounds the models with a queue of their own; further models share the queue
	// of "" (saturation over every node). Default 64.
	MaxModels int
	// MaxTenantLabels bounds the tenant label values (then "other"). Default 64.
	MaxTenantLabels int
	// Now is the clock; nil is time.Now.
	Now func() time.Time
}

// DefaultLimits are the queue bounds when flow control is on. Bounds: 1,024 queued requests in
// all (a queued front door request holds its body, at most 8 MiB and within the body budget,
// and a goroutine), sheddable ones at most 256 so they never crowd the others out. Waits:
// below the usual client timeouts, shorter for less important classes so that their clients
// hear early that they should retry elsewhere or later.
func DefaultLimits() Limits {
	return Limits{
		MaxQueued: [NumClasses]int{1024, 1024, 256},
		MaxTotal:  1024,
		MaxWait:   [NumClasses]time.Duration{60 * time.Second, 30 * time.Second, 10 * time.Second},
	}
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{Limits: DefaultLimits(), Thresholds: DefaultThresholds(), Recheck: 50 * time.Millisecond,
		MaxModels: 64, MaxTenantLabels: 64}
}

// Validate reports the first field that cannot work.
func (c *Config) Validate() error {
	if err := c.Limits.Validate(); err != nil {
		return err
	}
	if err := c.Thresholds.Validate(); err != nil {
		return err
	}
	if c.Recheck <= 0 || c.MaxModels < 0 || c.MaxTenantLabels < 0 {
		return fmt.Errorf("flow: recheck %v must be positive, max models %d and tenant labels %d not negative", c.Recheck, c.MaxModels, c.MaxTenantLabels)
	}
	return nil
}

// minRead is the least time between two reads of the view by arriving requests when the
// headroom is spent: under saturation every arrival takes the slow path, and one read per
// millisecond is as fresh as in-flight counts change anyway.
const minRead = time.Millisecond

// Controller is flow control for one router: a pool per model (a Queue, its headroom and
// saturation), and one goroutine (Start) that re-reads the view, expires and dispatches.
type Controller struct {
	cfg Config
	src Source
	met *metrics
	now func() time.Time

	pools   atomic.Pointer[map[string]*pool] // copied on a new model
	poolsMu sync.Mutex                       // guards copies of pools
	kickCh  chan struct{}                    // capacity 1: something to dispatch or a new deadline

	wg     sync.WaitGroup
	cancel context.CancelFunc
}

type pool struct {
	c        *Controller
	model    string
	queued   atomic.Int64             // q.Len(), for the fast path
	classLen [NumClasses]atomic.Int64 // q.LenClass, for the gauge summed over pools
	budget   atomic.Int64             // requests that may still pass before the view is read again
	active   atomic.Int64             // requests admitted and not yet released

	mu       sync.Mutex // guards everything below
	q        *Queue[*waiter]
	eligible int
	readAt   time.Time
	loads    []NodeLoad // scratch

	release func() // the one release function of the pool's requests: no allocation per request
}

type waiter struct {
	item Item[*waiter]
	ch   chan error // capacity 1: nil when dispatched, a *ShedError when shed
}

// New returns a controller over src; its metrics go to reg (nil: none registered). Call Start
// to run its loop: without it nothing queued is dispatched or expired except by arrivals.
func New(cfg Config, src Source, reg prometheus.Registerer) (*Controller, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if src == nil {
		return nil, errors.New("flow: nil Source")
	}
	m, err := newMetrics(reg, cfg.MaxTenantLabels)
	if err != nil {
		return nil, fmt.Errorf("flow: register metrics: %w", err)
	}
	c := &Controller{cfg: cfg, src: src, met: m, now: cfg.Now, kickCh: make(chan struct{}, 1)}
	if c.now == nil {
		c.now = time.Now
	}
	empty := map[string]*pool{}
	c.pools.Store(&empty)
	return c, nil
}

// ClassOf is the class of a request: its own when it names a known one, else its model's
// default, else Standard.
func (c *Controller) ClassOf(r *Request) Class {
	if r.Priority != "" {
		if cl, ok := ParseClass(strings.TrimSpace(r.Priority)); ok {
			return cl
		}
	}
	if cl, ok := c.cfg.ModelClasses[r.Model]; ok {
		return cl
	}
	return Standard
}

func (c *Controller) pool(model string) *pool {
	if p := (*c.pools.Load())[model]; p != nil {
		return p
	}
	c.poolsMu.Lock()
	defer c.poolsMu.Unlock()
	cur := *c.pools.Load()
	if p := cur[model]; p != nil {
		return p
	}
	if model != "" && len(cur) >= c.cfg.MaxModels {
		if p := cur[""]; p != nil {
			return p
		}
		model = ""
	}
	q, _ := NewQueue[*waiter](c.cfg.Limits) // validated in New
	p := &pool{c: c, model: model, q: q}
	p.release = func() {
		p.active.Add(-1)
		if p.queued.Load() > 0 {
			c.kick()
		}
	}
	next := make(map[string]*pool, len(cur)+1)
	for k, v := range cur {
		next[k] = v
	}
	next[model] = p
	c.pools.Store(&next)
	return p
}

func (c *Controller) kick() {
	select {
	case c.kickCh <- struct{}{}:
	default:
	}
}

// Admit lets r through, waits for capacity, or sheds it. On success the caller must call
// release exactly once when the request has ended (after the decision's in-flight count is
// given back), so that queued requests are released. Errors: *ShedError (429), ErrNoNodes
// (503), or ctx's error when the caller went away while queued (the request was removed).
func (c *Controller) Admit(ctx context.Context, r Request) (release func(), err error) {
	p := c.pool(r.Model)
	cl := c.ClassOf(&r)
	// The fast path: nothing queued ahead and headroom left. A few atomics, no lock.
	if p.queued.Load() == 0 {
		if p.budget.Add(-1) >= 0 {
			p.active.Add(1)
			c.met.direct[cl].Inc()
			c.met.tenant(r.Tenant).dispatched.Inc()
			return p.release, nil
		}
		p.budget.Add(1)
	}
	return c.admitSlow(ctx, p, cl, &r)
}

func (c *Controller) admitSlow(ctx context.Context, p *pool, cl Class, r *Request) (func(), error) {
	tenant := r.Tenant
	if len(tenant) > maxTenantBytes {
		tenant = tenant[:maxTenantBytes]
	}
	p.mu.Lock()
	now := c.now()
	if now.Sub(p.readAt) >= minRead {
		p.readLocked(now)
	}
	if p.eligible == 0 {
		p.mu.Unlock()
		return nil, ErrNoNodes
	}
	// Release first what the view allows, so that the queue this request finds is the one it
	// would have found had the loop run since the last completion.
	p.dispatchLocked(now)
	if p.q.Len() == 0 && p.budget.Load() > 0 {
		p.budget.Add(-1)
		p.active.Add(1)
		p.mu.Unlock()
		c.met.direct[cl].Inc()
		c.met.tenant(r.Tenant).dispatched.Inc()
		return p.release, nil
	}
	w := &waiter{ch: make(chan error, 1)}
	w.item = Item[*waiter]{Value: w, Class: cl, Tenant: tenant, Enqueued: now}
	shed, why := p.q.Push(&w.item)
	if shed != nil {
		c.shed(shed, why)
	}
	p.dispatchLocked(now) // headroom the last read left, if any: first come first
	p.mu.Unlock()
	if shed == &w.item {
		<-w.ch
		return nil, &ShedError{Class: cl, Reason: why}
	}
	c.kick() // the loop's timer may need the new deadline
	select {
	case err := <-w.ch:
		if err != nil {
			return nil, err
		}
		return p.release, nil
	case <-ctx.Done():
	}
	p.mu.Lock()
	removed := p.q.Remove(&w.item)
	p.syncLocked()
	p.mu.Unlock()
	if removed {
		c.met.cancelled[cl].Inc()
		c.met.tenant(w.item.Tenant).cancelled.Inc()
		return nil, ctx.Err()
	}
	// Dispatched or shed while the caller left: a dispatch is given back at once.
	if err := <-w.ch; err == nil {
		p.release()
	}
	return nil, ctx.Err()
}

// shed answers a request the queue shed, and counts it.
func (c *Controller) shed(it *Item[*waiter], why Reason) {
	c.met.shed[it.Class][reasonIndex(why)].Inc()
	c.met.tenant(it.Tenant).shed.Inc()
	it.Value.ch <- &ShedError{Class: it.Class, Reason: why}
}

// readLocked reads the view: eligible nodes, saturation, and the headroom the fast path spends.
func (p *pool) readLocked(now time.Time) {
	p.loads = p.c.src.AppendLoads(p.loads[:0], p.model)
	mean, room := p.c.cfg.Thresholds.Headroom(p.loads)
	p.eligible, p.readAt = len(p.loads), now
	// Stored, not added: the view counts the requests in flight since the last read, so the
	// headroom spent since is already in it; except the requests admitted that have not been
	// decided yet (tokenising), which no in-flight count holds: this router's admitted requests
	// beyond the in-flight counts are taken off. Without it a read between admission and
	// decision grants the same headroom twice.
	inflight := 0
	for i := range p.loads {
		inflight += p.loads[i].InFlight
	}
	if pending := int(p.active.Load()) - inflight; pending > 0 {
		room = max(room-pending, 0)
	}
	p.budget.Store(int64(room))
	if len(p.loads) > 0 {
		p.c.met.saturation.WithLabelValues(p.model).Set(mean)
	}
}

// syncLocked publishes the queue's length to the fast path and the gauge.
func (p *pool) syncLocked() {
	p.queued.Store(int64(p.q.Len()))
	for cl := range NumClasses {
		p.classLen[cl].Store(int64(p.q.LenClass(Class(cl))))
		n := int64(0)
		for _, o := range *p.c.pools.Load() {
			n += o.classLen[cl].Load()
		}
		p.c.met.queued[cl].Set(float64(n))
	}
}

// dispatchLocked releases queued requests while there is headroom, and expires those past
// their wait.
func (p *pool) dispatchLocked(now time.Time) {
	p.q.Expire(now, func(it *Item[*waiter]) { p.c.shed(it, ReasonWaitTimeout) })
	for p.q.Len() > 0 && p.budget.Load() > 0 {
		it := p.q.Pop()
		p.budget.Add(-1)
		p.active.Add(1)
		p.c.met.wait[it.Class].Observe(now.Sub(it.Enqueued).Seconds())
		p.c.met.dequeued[it.Class].Inc()
		p.c.met.tenant(it.Tenant).dispatched.Inc()
		it.Value.ch <- nil
	}
	p.syncLocked()
}

// Start runs the controller's loop until ctx ends or Close: on each kick (a completion with
// requests queued, an arrival), each Recheck and each queue deadline it reads the view of every
// model with a queue, expires and dispatches. It does not block.
func (c *Controller) Start(ctx context.Context) {
	ctx, c.cancel = context.WithCancel(ctx)
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		c.loop(ctx)
	}()
}

// Close stops the loop and waits for it.
func (c *Controller) Close() {
	if c.cancel != nil {
		c.cancel()
	}
	c.wg.Wait()
}

func (c *Controller) loop(ctx context.Context) {
	tick := time.NewTicker(c.cfg.Recheck)
	defer tick.Stop()
	deadline := time.NewTimer(time.Hour)
	defer deadline.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.kickCh:
		case <-tick.C:
		case <-deadline.C:
		}
		if next, ok := c.Step(); ok {
			deadline.Reset(max(next.Sub(c.now()), time.Millisecond))
		} else {
			deadline.Reset(time.Hour)
		}
	}
}

// Step is one pass of the loop, exported for tests that drive the controller with their own
// clock: every pool reads the view, expires and dispatches. It returns the next queue deadline.
func (c *Controller) Step() (next time.Time, ok bool) {
	now := c.now()
	for _, p := range *c.pools.Load() {
		p.mu.Lock()
		p.readLocked(now)
		p.dispatchLocked(now)
		if d, has := p.q.NextDeadline(); has && (!ok || d.Before(next)) {
			next, ok = d, true
		}
		p.mu.Unlock()
	}
	return next, ok
}

// Queued is the number of requests queued now, over every model.
func (c *Controller) Queued() int {
	n := 0
	for _, p := range *c.pools.Load() {
		n += int(p.queued.Load())
	}
	return n
}
