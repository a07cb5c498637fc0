package frontdoor

import (
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"
)

// fakeClock is a settable clock.
type fakeClock struct {
	mu sync.Mutex // guards t
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// The passive health state machine: N consecutive failures eject; success resets the streak; the
// window ends in half-open, where one failure ejects again for twice as long; MarkHealthy ends
// an ejection at once.
func TestHealthStateMachine(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	cfg := DefaultHealthConfig()
	h, err := NewHealth(cfg, nil, nil, clk.now)
	if err != nil {
		t.Fatal(err)
	}
	var ejections []string
	h.OnEject(func(id string) { ejections = append(ejections, id) })
	h.ReportFailure("n")
	h.ReportFailure("n")
	h.ReportSuccess("n") // streak broken
	h.ReportFailure("n")
	h.ReportFailure("n")
	if h.Ejected("n") {
		t.Fatal("ejected after 2 consecutive failures")
	}
	h.ReportFailure("n")
	if !h.Ejected("n") || len(ejections) != 1 {
		t.Fatalf("not ejected after %d consecutive failures", cfg.EjectAfter)
	}
	h.ReportSuccess("n") // a request that started before the ejection does not end it
	clk.add(cfg.Backoff - time.Millisecond)
	if !h.Ejected("n") {
		t.Fatal("ejection ended before its window")
	}
	clk.add(time.Millisecond)
	if h.Ejected("n") {
		t.Fatal("still ejected after the window")
	}
	h.ReportFailure("n") // half-open: one failure is enough
	if !h.Ejected("n") {
		t.Fatal("half-open node not ejected by one failure")
	}
	clk.add(2*cfg.Backoff - time.Millisecond)
	if !h.Ejected("n") {
		t.Fatal("second ejection is not twice as long")
	}
	h.MarkHealthy("n")
	if h.Ejected("n") || h.Ejected("other") {
		t.Fatal("MarkHealthy did not bring the node back")
	}
	if err := (HealthConfig{}).Validate(); err == nil {
		t.Fatal("zero HealthConfig validated")
	}
}

// Ejected answers without the lock while no node is ejected; the count behind that follows every
// way an ejection starts and ends (the window passing, MarkHealthy, the node leaving the view),
// so one node's return never hides another's ejection.
func TestEjectedCountFollowsEjections(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	cfg := DefaultHealthConfig()
	list := &nodeList{}
	list.set([]NodeTarget{target("a", "http://a"), target("b", "http://b"), target("c", "http://c")})
	h, err := NewHealth(cfg, list, nil, clk.now)
	if err != nil {
		t.Fatal(err)
	}
	eject := func(id string) {
		for range cfg.EjectAfter {
			h.ReportFailure(id)
		}
	}
	check := func(step string, want int64, ejected ...string) {
		t.Helper()
		for _, id := range []string{"a", "b", "c"} {
			if h.Ejected(id) != slices.Contains(ejected, id) {
				t.Fatalf("%s: Ejected(%s) = %v, want ejected %v", step, id, h.Ejected(id), ejected)
			}
		}
		// After asking: a passed window ends the ejection when it is next asked about.
		if got := h.ejected.Load(); got != want {
			t.Fatalf("%s: %d nodes counted as ejected, want %d", step, got, want)
		}
	}
	check("at start", 0)
	eject("a")
	eject("b")
	eject("b") // already ejected: counted once
	check("a and b ejected", 2, "a", "b")
	h.MarkHealthy("a")
	check("a marked healthy", 1, "b")
	clk.add(cfg.Backoff)
	check("b's window passed", 0)
	eject("c")
	eject("a")
	list.set([]NodeTarget{target("a", "http://a"), target("b", "http://b")})
	h.Sweep()
	check("c left the view", 1, "a")
}

// A node that keeps failing is ejected from routing (no more requests reach it, no client sees
// an error thanks to the retry), and a probe brings it back once it answers again.
func TestEjectionAndProbeRecovery(t *testing.T) {
	bad := &scriptedUpstream{script: []int{500}}
	bad.sick.Store(true)
	good := &scriptedUpstream{script: []int{200}}
	badSrv, goodSrv := httptestServer(t, bad), httptestServer(t, good)
	hc := DefaultHealthConfig()
	hc.ProbeInterval = 5 * time.Millisecond
	hc.Backoff, hc.MaxBackoff = time.Hour, time.Hour // only the probe may bring it back
	f := startFrontDoor(t, []NodeTarget{target("bad", badSrv.URL), target("good", goodSrv.URL)}, fleetOpts{health: &hc})
	send := func(i int) *result {
		t.Helper()
		r, err := do(t.Context(), http.DefaultClient, f.srv.URL, "/v1/completions", fmt.Sprintf(`{"prompt":"prompt number %d is long enough to fill one whole block of sixteen tokens or more"}`, i), nil)
		if err != nil || r.status != 200 {
			t.Fatalf("request %d: %+v %v", i, r, err)
		}
		return r
	}
	i := 0
	for ; !f.health.Ejected("bad"); i++ {
		if i == 100 {
			t.Fatal("bad node not ejected after 100 requests")
		}
		send(i)
	}
	if bad.hits.Load() != 3 || counterValue(t, f.reg, "prefixmesh_frontdoor_ejections_total") != 1 {
		t.Fatalf("ejected after %d failures (ejections %v), want 3", bad.hits.Load(), counterValue(t, f.reg, "prefixmesh_frontdoor_ejections_total"))
	}
	for range 20 {
		send(i)
		i++
	}
	if bad.hits.Load() != 3 {
		t.Fatalf("ejected node still received requests: %d", bad.hits.Load())
	}
	f.health.ProbeOnce(t.Context()) // still sick: stays out
	if !f.health.Ejected("bad") {
		t.Fatal("a failing probe brought the node back")
	}
	// The node recovers; the probe loop notices.
	bad.script = []int{200} // no request reaches it while ejected, so no race with the handler
	bad.sick.Store(false)
	f.health.Start(t.Context())
	defer f.health.Close()
	eventually(t, "the probe to bring the node back", func() bool { return !f.health.Ejected("bad") })
	before := bad.hits.Load()
	for j := 0; bad.hits.Load() == before; j++ {
		if j == 100 {
			t.Fatal("recovered node gets no traffic")
		}
		send(i)
		i++
	}
}
