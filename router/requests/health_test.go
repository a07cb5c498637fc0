package requests

import (
	"fmt"
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

// A thousand node ids that came, failed, were ejected and left leave nothing behind once the
// view no longer lists them: the health table holds the present nodes only, and the sweep hook
// hears which are present.
func TestChurnedNodesAreForgotten(t *testing.T) {
	list := &nodeList{}
	present := []NodeTarget{target("a", "http://a"), target("b", "http://b")}
	churned := append([]NodeTarget(nil), present...)
	for i := range 1000 {
		churned = append(churned, target(fmt.Sprintf("churn-%04d", i), "http://127.0.0.1:1"))
	}
	list.set(churned)
	h, err := NewHealth(DefaultHealthConfig(), list, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var heard map[string]bool
	h.OnSweep(func(p map[string]bool) { heard = p })
	for _, n := range churned[2:] {
		for range DefaultHealthConfig().EjectAfter {
			h.ReportFailure(n.Info.ID)
		}
	}
	if got := h.tracked(); got != 1000 {
		t.Fatalf("health tracks %d nodes after 1000 failed, want 1000", got)
	}
	list.set(present) // the churned nodes leave the view
	h.Sweep()
	if got := h.tracked(); got != 0 {
		t.Errorf("health still tracks %d nodes that left", got)
	}
	if len(heard) != 2 || !heard["a"] || !heard["b"] {
		t.Errorf("the sweep hook heard %v, want a and b", heard)
	}
}

// tracked is how many nodes the health table holds.
func (h *Health) tracked() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.nodes)
}
