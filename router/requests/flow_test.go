package requests

import (
	"context"
	"net/http"
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

// TestFlowGatewayPick: the gateway's picks are admitted at the same point, with the headers
// the endpoint picker passes, and released when the pick ends; a shed comes back as the error.
func TestFlowGatewayPick(t *testing.T) {
	p, _, _ := newTestPicker(t, 1, PolicyPickerConfig{})
	stub := &stubFlow{}
	svc, err := New(DefaultConfig(), Deps{Picker: p, Flow: stub})
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{}
	h.Set(flow.HeaderTenant, "t1")
	body := []byte(`{"model":"` + simModel + `","prompt":"hello","max_tokens":1}`)
	pk, err := svc.PickForGateway(t.Context(), &GatewayRequest{Path: "/v1/completions", Header: h, Body: body})
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
	if got := p.Decider().OwnInFlight(pk.NodeID); got != (routing.InFlight{}) {
		t.Fatalf("in flight after End: %+v", got)
	}
	stub.err = &flow.ShedError{Reason: flow.ReasonQueueFull}
	if _, err := svc.PickForGateway(t.Context(), &GatewayRequest{Path: "/v1/completions", Body: body}); err != stub.err {
		t.Fatalf("err %v", err)
	}
}

// FlowRequest reads the class and the first tenant header present, from HTTP headers and from
// gRPC-style lower-case keys alike.
func TestFlowRequest(t *testing.T) {
	h := http.Header{}
	h.Set(flow.HeaderPriority, "sheddable")
	h.Set("X-Gateway-Inference-Fairness-Id", "old")
	h.Set("X-Llm-D-Inference-Fairness-Id", "acme")
	if got := FlowRequest("m", h.Get); got != (flow.Request{Model: "m", Priority: "sheddable", Tenant: "acme"}) {
		t.Fatalf("from headers: %+v", got)
	}
	md := map[string]string{"x-prefixmesh-priority": "critical", "x-prefixmesh-tenant": "t"}
	lower := func(k string) string {
		for mk, v := range md {
			if http.CanonicalHeaderKey(mk) == http.CanonicalHeaderKey(k) {
				return v
			}
		}
		return ""
	}
	if got := FlowRequest("", lower); got != (flow.Request{Priority: "critical", Tenant: "t"}) {
		t.Fatalf("from metadata: %+v", got)
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

// TestAllocsFlowAdmission: with flow control on and the fleet not saturated, a door's admission
// (reading the class and tenant headers, Admit, release) allocates nothing, so the decision's
// allocation count (TestAllocsPickDecisionFixed) is the request's with flow control.
func TestAllocsFlowAdmission(t *testing.T) {
	testenv.SkipAllocsUnderRace(t)
	fc, err := flow.New(flow.DefaultConfig(), idleLoads(1000), nil) // headroom 5,000
	if err != nil {
		t.Fatal(err)
	}
	s := &Service{flow: fc}
	h := http.Header{}
	h.Set(flow.HeaderPriority, "critical")
	h.Set("X-Llm-D-Inference-Fairness-Id", "acme")
	admit := func() {
		rel, err := s.AdmitFlow(t.Context(), simModel, h)
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
