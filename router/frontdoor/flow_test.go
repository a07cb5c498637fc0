package frontdoor

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/prefixmesh/prefixmesh/router/flow"
	"github.com/prefixmesh/prefixmesh/router/requests"
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
			fd, err := New(DefaultConfig(), Deps{Service: newServiceWith(t, requests.DefaultConfig(), requests.Deps{Picker: f.picker, Flow: stub})})
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
