package extproc

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"

	procv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"

	"github.com/prefixmesh/prefixmesh/router/extproc/fakegw"
	"github.com/prefixmesh/prefixmesh/router/flow"
)

type stubFlow struct {
	mu    sync.Mutex
	err   error
	asked []flow.Request
}

func (s *stubFlow) Admit(_ context.Context, r flow.Request) (func(), error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.asked = append(s.asked, r)
	if s.err != nil {
		return nil, s.err
	}
	return func() {}, nil
}

// TestFlowImmediateResponses: a request flow control sheds is answered to the gateway at once
// with the front door's status and headers (429, retry-after, the reason), no node with 503,
// and the class and tenant headers reach flow control through the picker.
func TestFlowImmediateResponses(t *testing.T) {
	for _, tc := range []struct {
		name   string
		err    error
		status int
		reason string
	}{
		{"admitted", nil, http.StatusOK, ""},
		{"displaced", &flow.ShedError{Class: flow.Sheddable, Reason: flow.ReasonDisplaced}, http.StatusTooManyRequests, "displaced"},
		{"wait timeout", &flow.ShedError{Class: flow.Standard, Reason: flow.ReasonWaitTimeout}, http.StatusTooManyRequests, "wait-timeout"},
		{"no nodes", flow.ErrNoNodes, http.StatusServiceUnavailable, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stub := &stubFlow{err: tc.err}
			r := newRig(t, rigOpts{nodes: 1, flow: stub})
			_, url := r.gateway(fakegw.Config{RequestMode: procv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseMode: procv3.ProcessingMode_FULL_DUPLEX_STREAMED})
			req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/v1/completions",
				strings.NewReader(`{"model":"`+simModel+`","prompt":"hello there","max_tokens":2}`))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set(flow.HeaderPriority, "critical")
			req.Header.Set("X-Gateway-Inference-Fairness-Id", "acme")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.status || resp.Header.Get(flow.HeaderDroppedReason) != tc.reason {
				t.Fatalf("status %d reason %q, want %d %q", resp.StatusCode, resp.Header.Get(flow.HeaderDroppedReason), tc.status, tc.reason)
			}
			if tc.status != http.StatusOK && resp.Header.Get("Retry-After") == "" {
				t.Fatal("no Retry-After")
			}
			stub.mu.Lock()
			defer stub.mu.Unlock()
			if len(stub.asked) != 1 || stub.asked[0] != (flow.Request{Model: simModel, Priority: "critical", Tenant: "acme"}) {
				t.Fatalf("asked %+v", stub.asked)
			}
		})
	}
}
