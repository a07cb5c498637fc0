package frontdoor

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixmesh/prefixmesh/router/flow"
	"github.com/prefixmesh/prefixmesh/router/requests"
	"github.com/prefixmesh/prefixmesh/routing"
)

// deciderLoad is flow control's view of a test fleet: the picker's in-flight counts, as the
// router's FlowSource reads them (the simulated engines' own load reports are not mirrored
// here, so in-flight requests are the whole load).
type deciderLoad struct{ f *fleet }

func (d deciderLoad) AppendLoads(dst []flow.NodeLoad, _ string) []flow.NodeLoad {
	now := time.Now()
	for _, n := range d.f.list.Nodes() {
		dst = append(dst, flow.NodeLoad{InFlight: d.f.picker.Decider().TotalInFlight(n.Info.ID, now).Requests})
	}
	return dst
}

// measured wraps flow control to measure, per tenant, each admitted request's wait and how many
// other requests were admitted while it waited (overtaken): a count of dispatches, which the
// fairness rule bounds whatever the machine's speed.
type measured struct {
	inner    flow.Admitter
	admitted atomic.Int64
	mu       sync.Mutex
	waits    map[string][]time.Duration
	overtook map[string][]int64
}

func (m *measured) Admit(ctx context.Context, r flow.Request) (func(), error) {
	start, before := time.Now(), m.admitted.Load()
	rel, err := m.inner.Admit(ctx, r)
	if err == nil {
		after := m.admitted.Add(1)
		m.mu.Lock()
		m.waits[r.Tenant] = append(m.waits[r.Tenant], time.Since(start))
		m.overtook[r.Tenant] = append(m.overtook[r.Tenant], after-before-1)
		m.mu.Unlock()
	}
	return rel, err
}

func p99[T int64 | time.Duration](a []T) T {
	s := slices.Clone(a)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*99/100)]
}

// TestFlowControlUnderLoad: a front door over two simulated engines whose capacity flow control
// sees as 4 requests in flight (queue threshold 2 per node), three tenants in closed loops: one
// floods (30 standard clients), one is quiet (2 standard clients), one sends sheddable work (6
// clients). By construction of the bounds, standard requests are never shed (at most 62 of
// them exist, the queue holds 80) and sheddable ones are (their class holds 2): the lower
// class pays first. The quiet tenant, served in turn with the flood, is overtaken by a few
// dispatches at most, where the flood's requests wait behind the whole flood. Every request
// gets exactly one answer, and flow control's own counts agree with the client's.
func TestFlowControlUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("a load test")
	}
	eng := fastEngineConfig()
	eng.DecodeTokensPerSec = 2000 // a few milliseconds per request: requests overlap
	f := startFleet(t, fleetOpts{nodes: 2, policy: routing.PolicyPrefixMesh, engine: eng})
	fcfg := flow.DefaultConfig()
	fcfg.Thresholds.QueueDepth = 2
	fcfg.Limits = flow.Limits{MaxQueued: [flow.NumClasses]int{80, 80, 2}, MaxTotal: 80,
		MaxWait: [flow.NumClasses]time.Duration{time.Minute, time.Minute, 200 * time.Millisecond}}
	fcfg.Recheck = 10 * time.Millisecond
	reg := prometheus.NewRegistry()
	fc, err := flow.New(fcfg, deciderLoad{f}, reg)
	if err != nil {
		t.Fatal(err)
	}
	fc.Start(t.Context())
	t.Cleanup(fc.Close)
	m := &measured{inner: fc, waits: map[string][]time.Duration{}, overtook: map[string][]int64{}}
	fd, err := New(DefaultConfig(), Deps{Service: newServiceWith(t, requests.DefaultConfig(), requests.Deps{Picker: f.picker, Flow: m})})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(fd.Handler())
	t.Cleanup(srv.Close)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	t.Cleanup(client.CloseIdleConnections)

	type tenant struct {
		name, class     string
		clients, each   int
		sent            atomic.Int64
		ok, shed, other atomic.Int64
	}
	tenants := []*tenant{
		{name: "flood", class: "standard", clients: 60, each: 10},
		{name: "quiet", class: "standard", clients: 2, each: 20},
		{name: "batch", class: "sheddable", clients: 6, each: 20},
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute) // bounds the whole run
	defer cancel()
	var wg sync.WaitGroup
	var badShed atomic.Value
	for _, tn := range tenants {
		for c := range tn.clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				h := http.Header{}
				h.Set(flow.HeaderPriority, tn.class)
				h.Set(flow.HeaderTenant, tn.name)
				for i := range tn.each {
					tn.sent.Add(1)
					res, err := do(ctx, client, srv.URL, "/v1/completions",
						map[string]any{"model": simModel, "prompt": fmt.Sprintf("%s %d %d", tn.name, c, i), "max_tokens": 8}, h)
					switch {
					case err != nil:
						tn.other.Add(1)
						badShed.Store(err.Error())
					case res.status == http.StatusOK:
						tn.ok.Add(1)
					case res.status == http.StatusTooManyRequests:
						tn.shed.Add(1)
						why := res.header.Get(flow.HeaderDroppedReason)
						if res.header.Get("Retry-After") == "" || (why != "queue-full" && why != "wait-timeout" && why != "displaced") {
							badShed.Store(fmt.Sprintf("429 with Retry-After %q, reason %q", res.header.Get("Retry-After"), why))
						}
					default:
						tn.other.Add(1)
						badShed.Store(fmt.Sprintf("status %d", res.status))
					}
				}
			}()
		}
	}
	wg.Wait()
	if v := badShed.Load(); v != nil {
		t.Fatalf("an answer was not a 200 or a proper 429: %v", v)
	}
	var ok, shed int64
	for _, tn := range tenants {
		answers := tn.ok.Load() + tn.shed.Load() + tn.other.Load()
		if answers != tn.sent.Load() || tn.sent.Load() != int64(tn.clients*tn.each) {
			t.Fatalf("%s: sent %d, answered %d", tn.name, tn.sent.Load(), answers)
		}
		ok, shed = ok+tn.ok.Load(), shed+tn.shed.Load()
		t.Logf("%s (%s): %d ok, %d shed (429)", tn.name, tn.class, tn.ok.Load(), tn.shed.Load())
	}
	if tenants[0].shed.Load()+tenants[1].shed.Load() != 0 || tenants[2].shed.Load() == 0 {
		t.Fatal("the lower class must pay first: no standard request shed, some sheddable ones")
	}
	// Flow control's counts agree with the client's: each request admitted or shed once.
	dispatched, shedM := 0.0, 0.0
	for _, c := range []string{"critical", "standard", "sheddable"} {
		for _, p := range []string{"direct", "queued"} {
			dispatched += gathered(t, reg, "prefixmesh_flow_dispatched_total", c, p)
		}
		for _, r := range flow.Reasons {
			shedM += gathered(t, reg, "prefixmesh_flow_shed_total", c, string(r))
		}
	}
	if int64(dispatched) != ok || int64(shedM) != shed || fc.Queued() != 0 {
		t.Fatalf("flow control dispatched %v and shed %v, the clients saw %d and %d; %d left queued", dispatched, shedM, ok, shed, fc.Queued())
	}
	// Fairness: a quiet request waits for its turn between the flood's, not behind the flood.
	// Bound, in dispatches: while it is queued, the quiet tenant's other requests and one flood
	// request per quiet one (tenants × clients, doubled for a round under way); around that, the
	// dispatches of a view read on its way in and on its way out (at most the capacity, 4, each),
	// doubled for the counter read outside the lock. The flood's own requests wait behind the
	// flood (about its 60 clients).
	const capacity = 4
	bound := int64(2*2*tenants[1].clients + 2*2*capacity)
	qOver, fOver := p99(m.overtook["quiet"]), p99(m.overtook["flood"])
	t.Logf("p99 queue wait: quiet %v (overtaken by %d), flood %v (overtaken by %d)",
		p99(m.waits["quiet"]), qOver, p99(m.waits["flood"]), fOver)
	if qOver > bound {
		t.Fatalf("the quiet tenant's p99 request was overtaken by %d others, over the bound %d", qOver, bound)
	}
}

// gathered is the value of the counter name with these label values (in label name order).
func gathered(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, mt := range mf.GetMetric() {
			match := len(mt.GetLabel()) == len(labels)
			for i, l := range mt.GetLabel() {
				match = match && l.GetValue() == labels[i]
			}
			if match {
				return mt.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no %s%v", name, labels)
	return 0
}
