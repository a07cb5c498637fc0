package flow

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// fakeSource is a fleet whose load the test sets.
type fakeSource struct {
	mu    sync.Mutex
	loads []NodeLoad
}

func (f *fakeSource) AppendLoads(dst []NodeLoad, _ string) []NodeLoad {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append(dst, f.loads...)
}

func (f *fakeSource) set(l ...NodeLoad) {
	f.mu.Lock()
	f.loads = l
	f.mu.Unlock()
}

// fakeClock is a clock the test moves.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newTestController(t *testing.T, src Source, clk *fakeClock, mutate func(*Config)) (*Controller, *prometheus.Registry) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Limits = Limits{MaxQueued: [NumClasses]int{4, 4, 4}, MaxTotal: 4,
		MaxWait: [NumClasses]time.Duration{3 * time.Second, 2 * time.Second, time.Second}}
	if clk != nil {
		cfg.Now = clk.now
	}
	if mutate != nil {
		mutate(&cfg)
	}
	reg := prometheus.NewRegistry()
	c, err := New(cfg, src, reg)
	if err != nil {
		t.Fatal(err)
	}
	return c, reg
}

// waitQueued waits (bounded) until n requests are queued.
func waitQueued(t *testing.T, c *Controller, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for c.Queued() != n {
		if time.Now().After(deadline) {
			t.Fatalf("queued %d, want %d", c.Queued(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

type result struct {
	name    string
	release func()
	err     error
}

func admitAsync(c *Controller, ctx context.Context, name string, r Request, out chan<- result) {
	go func() {
		rel, err := c.Admit(ctx, r)
		out <- result{name, rel, err}
	}()
}

func shedReason(err error) Reason {
	var se *ShedError
	if errors.As(err, &se) {
		return se.Reason
	}
	return ""
}

func TestAdmitPassesWhenNotSaturated(t *testing.T) {
	src := &fakeSource{}
	src.set(NodeLoad{}, NodeLoad{Waiting: 4})
	c, reg := newTestController(t, src, &fakeClock{t: time.Unix(0, 0)}, nil)
	for range 5 { // headroom ceil((1 − 0.4) × 2 × 5) = 6
		rel, err := c.Admit(context.Background(), Request{Tenant: "a"})
		if err != nil {
			t.Fatal(err)
		}
		rel()
	}
	if got := testutil.ToFloat64(c.met.direct[Standard]); got != 5 {
		t.Fatalf("direct %v", got)
	}
	if n, err := testutil.GatherAndCount(reg, "prefixmesh_flow_shed_total"); err != nil || n != NumClasses*len(Reasons) {
		t.Fatalf("shed series %d (%v): every class and reason is created at zero", n, err)
	}
}

func TestAdmitNoNodes(t *testing.T) {
	c, _ := newTestController(t, &fakeSource{}, nil, nil)
	if _, err := c.Admit(context.Background(), Request{}); !errors.Is(err, ErrNoNodes) {
		t.Fatalf("err %v", err)
	}
}

// TestQueuedReleasedInPriorityOrder: while saturated, requests wait; as capacity appears they
// go critical first, then tenants in turn.
func TestQueuedReleasedInPriorityOrder(t *testing.T) {
	src := &fakeSource{}
	src.set(NodeLoad{Waiting: 5})
	clk := &fakeClock{t: time.Unix(0, 0)}
	c, _ := newTestController(t, src, clk, nil)
	out := make(chan result, 8)
	ctx := context.Background()
	for i, r := range []Request{{Tenant: "a"}, {Tenant: "a"}, {Tenant: "b"}, {Priority: "critical", Tenant: "c"}} {
		admitAsync(c, ctx, fmt.Sprint(i), r, out)
		waitQueued(t, c, i+1)
	}
	var order []string
	for range 4 {
		src.set(NodeLoad{Waiting: 4}) // room for one: ceil(0.2 × 5) = 1
		c.Step()
		r := <-out
		if r.err != nil {
			t.Fatal(r.err)
		}
		r.release()
		order = append(order, r.name)
	}
	if fmt.Sprint(order) != "[3 0 2 1]" {
		t.Fatalf("order %v, want critical, then a and b in turn", order)
	}
	if c.Queued() != 0 {
		t.Fatal("left queued")
	}
}

func TestWaitTimeoutAndDisplacement(t *testing.T) {
	src := &fakeSource{}
	src.set(NodeLoad{Waiting: 5})
	clk := &fakeClock{t: time.Unix(0, 0)}
	c, _ := newTestController(t, src, clk, func(cfg *Config) { cfg.Limits.MaxTotal = 2 })
	out := make(chan result, 8)
	ctx := context.Background()
	admitAsync(c, ctx, "s", Request{Priority: "sheddable"}, out)
	waitQueued(t, c, 1)
	admitAsync(c, ctx, "n", Request{}, out)
	waitQueued(t, c, 2)
	// A critical request arrives to the full queue: the sheddable one gives its place.
	admitAsync(c, ctx, "c", Request{Priority: "CRITICAL"}, out)
	r := <-out
	if r.name != "s" || shedReason(r.err) != ReasonDisplaced {
		t.Fatalf("%s: %v", r.name, r.err)
	}
	waitQueued(t, c, 2)
	// Another standard one finds nothing below it: shed at once.
	if _, err := c.Admit(ctx, Request{}); shedReason(err) != ReasonQueueFull {
		t.Fatalf("err %v", err)
	}
	// Past standard's 2 s wait, n is shed; critical (3 s) stays.
	clk.add(2 * time.Second)
	c.Step()
	r = <-out
	if r.name != "n" || shedReason(r.err) != ReasonWaitTimeout {
		t.Fatalf("%s: %v", r.name, r.err)
	}
	src.set(NodeLoad{})
	c.Step()
	if r = <-out; r.name != "c" || r.err != nil {
		t.Fatalf("%s: %v", r.name, r.err)
	}
	r.release()
	if got := testutil.ToFloat64(c.met.shed[Sheddable][reasonIndex(ReasonDisplaced)]); got != 1 {
		t.Fatalf("displaced %v", got)
	}
	if got := testutil.ToFloat64(c.met.dequeued[Critical]); got != 1 {
		t.Fatalf("dequeued critical %v", got)
	}
}

func TestCancelWhileQueued(t *testing.T) {
	src := &fakeSource{}
	src.set(NodeLoad{LoadAge: time.Minute}) // stale: saturated
	c, _ := newTestController(t, src, &fakeClock{t: time.Unix(0, 0)}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan result, 1)
	admitAsync(c, ctx, "x", Request{Tenant: "t"}, out)
	waitQueued(t, c, 1)
	cancel()
	if r := <-out; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("err %v", r.err)
	}
	if c.Queued() != 0 || testutil.ToFloat64(c.met.cancelled[Standard]) != 1 || testutil.ToFloat64(c.met.queued[Standard]) != 0 {
		t.Fatal("the cancelled request is still counted as queued")
	}
}

func TestModelDefaultClass(t *testing.T) {
	c, _ := newTestController(t, &fakeSource{}, nil, func(cfg *Config) { cfg.ModelClasses = map[string]Class{"batch": Sheddable} })
	for _, tc := range []struct {
		r    Request
		want Class
	}{
		{Request{Model: "batch"}, Sheddable},
		{Request{Model: "batch", Priority: "critical"}, Critical},
		{Request{Model: "batch", Priority: "bogus"}, Sheddable},
		{Request{Model: "chat"}, Standard},
		{Request{Model: "chat", Priority: " Sheddable "}, Sheddable},
	} {
		if got := c.ClassOf(&tc.r); got != tc.want {
			t.Errorf("%+v: %s, want %s", tc.r, got, tc.want)
		}
	}
}

func TestTenantLabelsCapped(t *testing.T) {
	m, err := newMetrics(nil, 3)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		m.tenant(fmt.Sprint("t", i)).dispatched.Inc()
	}
	m.tenant("\xff").dispatched.Inc()
	if got := testutil.CollectAndCount(m.tenantVec); got != 3*(3+2) {
		t.Fatalf("%d tenant series, want (3 tenants + none + other) × 3 outcomes", got)
	}
	if got := testutil.ToFloat64(m.tenantVec.WithLabelValues(tenantOther, outcomeDispatched)); got != 8 {
		t.Fatalf("other %v", got)
	}
}

// TestControllerConcurrent: many callers, capacity that comes and goes, cancellations and a
// running loop; every call gets exactly one answer, nothing stays queued, and the dispatches
// never exceed the headroom the view granted by more than the calls in between.
func TestControllerConcurrent(t *testing.T) {
	src := &fakeSource{}
	src.set(NodeLoad{Waiting: 5})
	c, _ := newTestController(t, src, nil, func(cfg *Config) {
		cfg.Limits = Limits{MaxQueued: [NumClasses]int{20, 20, 10}, MaxTotal: 30,
			MaxWait: [NumClasses]time.Duration{time.Second, 200 * time.Millisecond, 50 * time.Millisecond}}
		cfg.Recheck = 5 * time.Millisecond
	})
	c.Start(context.Background())
	defer c.Close()
	var inflight atomic.Int64
	stop := make(chan struct{})
	var flip sync.WaitGroup
	flip.Add(1)
	go func() { // capacity: the fleet's waiting queue follows this router's in-flight count
		defer flip.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			src.set(NodeLoad{InFlight: int(inflight.Load()) + 2*(i%3)})
		}
	}()
	const callers, calls = 16, 200
	var answers, ok, shed, cancelled atomic.Int64
	var wg sync.WaitGroup
	for g := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for i := range calls {
				ctx, cancel := context.WithCancel(context.Background())
				if rng.IntN(5) == 0 {
					go cancel()
				}
				rel, err := c.Admit(ctx, Request{Priority: classNames[rng.IntN(NumClasses)], Tenant: fmt.Sprint("t", g%4)})
				answers.Add(1)
				switch {
				case err == nil:
					ok.Add(1)
					inflight.Add(1)
					if i%2 == 0 {
						time.Sleep(time.Duration(rng.IntN(200)) * time.Microsecond)
					}
					inflight.Add(-1)
					rel()
				case errors.Is(err, context.Canceled):
					cancelled.Add(1)
				case shedReason(err) != "":
					shed.Add(1)
				default:
					t.Errorf("unexpected %v", err)
				}
				cancel()
			}
		}()
	}
	wg.Wait()
	close(stop)
	flip.Wait()
	if answers.Load() != callers*calls || ok.Load()+shed.Load()+cancelled.Load() != answers.Load() {
		t.Fatalf("answers %d: ok %d shed %d cancelled %d", answers.Load(), ok.Load(), shed.Load(), cancelled.Load())
	}
	if c.Queued() != 0 {
		t.Fatalf("%d left queued", c.Queued())
	}
	t.Logf("ok %d shed %d cancelled %d", ok.Load(), shed.Load(), cancelled.Load())
}
