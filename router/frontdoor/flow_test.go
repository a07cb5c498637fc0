package frontdoor

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/prefixmesh/prefixmesh/internal/testenv"
	"github.com/prefixmesh/prefixmesh/router/flow"
	"github.com/prefixmesh/prefixmesh/routing"
)

// stubFlow answers every admission with err and records what it was asked.
type stubFlow struct {
	err      error
	mu       sync.Mutex
	asked    []flow.Request
	released int
}

func (s *stubFlow) Admit(_ context.Context, r flow.Request) (func(), error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.asked = append(s.asked, r)
	if s.err != nil {
		return nil, s.err
	}
	return func() { s.mu.Lock(); s.released++; s.mu.Unlock() }, nil
}

// TestFlowAnswers: each answer of flow control reaches the client as the front door's other
// refusals do: 429 with Retry-After and the reason header, 503 for no node, and an admitted
// request is proxied and released once. The class and tenant come from the headers.
func TestFlowAnswers(t *testing.T) {
	f := startFleet(t, fleetOpts{nodes: 1, policy: routing.PolicyPrefixMesh})
	for _, tc := range []struct {
		name   string
		err    error
		status int
		reason string
	}{
		{"admitted", nil, http.StatusOK, ""},
		{"displaced", &flow.ShedError{Class: flow.Sheddable, Reason: flow.ReasonDisplaced}, http.StatusTooManyRequests, "displaced"},
		{"queue full", &flow.ShedError{Class: flow.Standard, Reason: flow.ReasonQueueFull}, http.StatusTooManyRequests, "queue-full"},
		{"wait timeout", &flow.ShedError{Class: flow.Critical, Reason: flow.ReasonWaitTimeout}, http.StatusTooManyRequests, "wait-timeout"},
		{"no nodes", flow.ErrNoNodes, http.StatusServiceUnavailable, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stub := &stubFlow{err: tc.err}
			fd, err := New(DefaultConfig(), Deps{Picker: f.picker, Flow: stub})
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(fd.Handler())
			defer srv.Close()
			h := http.Header{}
			h.Set(flow.HeaderPriority, "sheddable")
			h.Set("X-Llm-D-Inference-Fairness-Id", "acme")
			res, err := do(t.Context(), srv.Client(), srv.URL, "/v1/completions",
				map[string]any{"model": simModel, "prompt": "hello there", "max_tokens": 2}, h)
			if err != nil {
				t.Fatal(err)
			}
			if res.status != tc.status || res.header.Get(flow.HeaderDroppedReason) != tc.reason {
				t.Fatalf("status %d reason %q, want %d %q", res.status, res.header.Get(flow.HeaderDroppedReason), tc.status, tc.reason)
			}
			if tc.status != http.StatusOK && res.header.Get("Retry-After") == "" {
				t.Fatal("no Retry-After")
			}
			if tc.status == http.StatusTooManyRequests && (res.errBody == nil || res.errBody.Error.Code != codeOverloaded) {
				t.Fatalf("error body %+v", res.errBody)
			}
			stub.mu.Lock()
			defer stub.mu.Unlock()
			if len(stub.asked) != 1 || stub.asked[0] != (flow.Request{Model: simModel, Priority: "sheddable", Tenant: "acme"}) {
				t.Fatalf("asked %+v", stub.asked)
			}
			if want := map[bool]int{true: 1, false: 0}[tc.err == nil]; stub.released != want {
				t.Fatalf("released %d times, want %d", stub.released, want)
			}
		})
	}
}

// TestFlowGatewayPick: the gateway's picks are admitted at the same point, with the headers
// the endpoint picker passes, and released when the pick ends; a shed comes back as the error.
func TestFlowGatewayPick(t *testing.T) {
	f := startFleet(t, fleetOpts{nodes: 1, policy: routing.PolicyPrefixMesh})
	stub := &stubFlow{}
	fd, err := New(DefaultConfig(), Deps{Picker: f.picker, Flow: stub})
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{}
	h.Set(flow.HeaderTenant, "t1")
	body := []byte(`{"model":"` + simModel + `","prompt":"hello","max_tokens":1}`)
	pk, err := fd.PickForGateway(t.Context(), &GatewayRequest{Path: "/v1/completions", Header: h, Body: body})
	if err != nil {
		t.Fatal(err)
	}
	if stub.released != 0 {
		t.Fatal("released before the pick ended")
	}
	pk.End(nil)
	if stub.released != 1 || len(stub.asked) != 1 || stub.asked[0].Tenant != "t1" || stub.asked[0].Model != simModel {
		t.Fatalf("asked %+v released %d", stub.asked, stub.released)
	}
	stub.err = &flow.ShedError{Reason: flow.ReasonQueueFull}
	if _, err := fd.PickForGateway(t.Context(), &GatewayRequest{Path: "/v1/completions", Body: body}); err != stub.err {
		t.Fatalf("err %v", err)
	}
}

// idleLoads is a fleet of n idle nodes, as flow control reads it.
type idleLoads int

func (n idleLoads) AppendLoads(dst []flow.NodeLoad, _ string) []flow.NodeLoad {
	for range int(n) {
		dst = append(dst, flow.NodeLoad{})
	}
	return dst
}

// TestAllocsFlowAdmission: with flow control on and the fleet not saturated, the front door's
// admission (reading the class and tenant headers, Admit, release) allocates nothing, so the
// decision's allocation count (TestAllocsPickDecisionFixed) is the request's with flow control.
func TestAllocsFlowAdmission(t *testing.T) {
	testenv.SkipAllocsUnderRace(t)
	fc, err := flow.New(flow.DefaultConfig(), idleLoads(1000), nil) // headroom 5,000
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{flow: fc}
	h := http.Header{}
	h.Set(flow.HeaderPriority, "critical")
	h.Set("X-Llm-D-Inference-Fairness-Id", "acme")
	admit := func() {
		rel, err := s.admitFlow(t.Context(), simModel, h)
		if err != nil {
			t.Fatal(err)
		}
		rel()
	}
	admit() // the model's pool and the tenant's counters are made once
	if a := testing.AllocsPerRun(1000, admit); a != 0 {
		t.Fatalf("flow admission allocated %v times per request", a)
	}
}
