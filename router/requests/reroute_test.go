package requests

import (
	"encoding/json"
	"net/http"
	"slices"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// healthLog records passive-health reports in order.
type healthLog struct {
	mu      sync.Mutex // guards reports
	reports []string
}

func (h *healthLog) ReportFailure(node string) { h.add("failure " + node) }
func (h *healthLog) ReportSuccess(node string) { h.add("success " + node) }
func (h *healthLog) add(s string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.reports = append(h.reports, s)
}

func (h *healthLog) got() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.reports)
}

// A gateway pick over four nodes holding 0, 5, 10 and 15 of a 20-block prompt's blocks: node-03
// is chosen (240 cached tokens) with node-02 (160) and node-01 (80) as fallbacks. When the
// gateway says node-02 served, node-02 owns the request from the response headers on (its
// estimate at the decision is the one to compare); when it names a node the picker does not
// know, the chosen node keeps its count until the end and no estimate is known. Either way the
// chosen node's health hears a failure, and nothing stays in flight.
func TestGatewayPickReroute(t *testing.T) {
	for _, c := range []struct {
		name, served string
		moved        bool
		estimate     int
	}{
		{"to an alternate", "node-02", true, 160},
		{"to an unknown node", "10.9.9.9:8000", false, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, toks := stairPicker(t, 4, 320)
			health := &healthLog{}
			svc, err := New(DefaultConfig(), Deps{Picker: p, Health: health, Registry: prometheus.NewRegistry()})
			if err != nil {
				t.Fatal(err)
			}
			body, _ := json.Marshal(map[string]any{"model": simModel, "prompt": toks, "max_tokens": 1})
			gp, err := svc.PickForGateway(t.Context(), &GatewayRequest{Path: "/v1/completions", Body: body, Alternates: 2})
			if err != nil {
				t.Fatal(err)
			}
			if gp.NodeID != "node-03" || gp.EstimatedMatchedTokens != 240 || len(gp.Alternates) != 2 {
				t.Fatalf("picked %s (estimate %d), alternates %v; want node-03 (240) and two", gp.NodeID, gp.EstimatedMatchedTokens, gp.Alternates)
			}
			inFlight := func(want map[string]int) {
				t.Helper()
				for _, n := range []string{"node-00", "node-01", "node-02", "node-03"} {
					if got := p.InFlight(n); got != want[n] {
						t.Fatalf("%s: %d in flight, want %d", n, got, want[n])
					}
				}
			}
			inFlight(map[string]int{"node-03": 1})
			h := http.Header{}
			h.Set("Content-Type", "application/json")
			gp.ResponseHeaders(200, h, c.served)
			if c.moved {
				inFlight(map[string]int{"node-02": 1})
			} else {
				inFlight(map[string]int{"node-03": 1})
			}
			gp.ResponseBody([]byte(`{"choices":[{"text":"a"}],"usage":{"prompt_tokens":320,"prompt_tokens_details":{"cached_tokens":160}}}`))
			o := gp.End(nil)
			inFlight(nil)
			if !gp.ServedElsewhere() || o.Status != 200 || o.CachedTokens != 160 {
				t.Fatalf("served elsewhere %v, outcome %+v", gp.ServedElsewhere(), o)
			}
			if est, ok := gp.Estimate(); ok != c.moved || (ok && est != c.estimate) {
				t.Fatalf("estimate %d, %v; want %d, %v", est, ok, c.estimate, c.moved)
			}
			if got := health.got(); len(got) != 2 || got[0] != "failure node-03" || got[1] != "success "+c.served {
				t.Fatalf("health heard %v", got)
			}
		})
	}
}
