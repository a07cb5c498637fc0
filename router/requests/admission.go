package requests

import (
	"context"
	"net/http"
	"sync"

	"github.com/prefixmesh/prefixmesh/router/flow"
)

// Admission is what a request passes before it is read, tokenised and decided. The front door
// takes an in-flight slot for each request (Enter, Leave) and charges its body to the received
// body budget (Bodies); every door asks flow control (AdmitFlow) once the request's model is
// known. The endpoint picker bounds its streams and their bodies itself, and gRPC Route holds
// no request.

// admission is the router's own in-flight bound: a counter, not a queue, so a request over the
// cap is refused at once (429) and a draining service refuses everything new (503).
type admission struct {
	mu       sync.Mutex // guards everything below
	n, max   int
	draining bool
	idle     chan struct{} // closed when draining and n reaches 0
}

// Enter takes an in-flight slot: ErrDraining once Drain was called, ErrOverloaded at
// Config.MaxInFlight. A nil error must be followed by exactly one Leave.
func (s *Service) Enter() error {
	a := &s.adm
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case a.draining:
		return ErrDraining
	case a.n >= a.max:
		return ErrOverloaded
	}
	a.n++
	return nil
}

// Leave gives back the slot Enter took.
func (s *Service) Leave() {
	a := &s.adm
	a.mu.Lock()
	defer a.mu.Unlock()
	a.n--
	if a.n == 0 && a.idle != nil {
		close(a.idle)
		a.idle = nil
	}
}

// Drain refuses every Enter from now on and returns a channel closed once the requests in
// flight have left.
func (s *Service) Drain() <-chan struct{} {
	a := &s.adm
	a.mu.Lock()
	defer a.mu.Unlock()
	a.draining = true
	ch := make(chan struct{})
	if a.n == 0 {
		close(ch)
	} else if a.idle != nil {
		ch = a.idle
	} else {
		a.idle = ch
	}
	return ch
}

// Draining reports whether Drain was called.
func (s *Service) Draining() bool {
	s.adm.mu.Lock()
	defer s.adm.mu.Unlock()
	return s.adm.draining
}

// InFlight returns the requests holding a slot now.
func (s *Service) InFlight() int {
	s.adm.mu.Lock()
	defer s.adm.mu.Unlock()
	return s.adm.n
}

// MaxInFlight is Config.MaxInFlight, for the doors' answers.
func (s *Service) MaxInFlight() int { return s.cfg.MaxInFlight }

// FlowControl reports whether the service runs flow control (Deps.Flow): the endpoint picker
// then passes the headers flow control reads.
func (s *Service) FlowControl() bool { return s.flow != nil }

// AdmitFlow asks flow control to let a request for model through (router/flow): at once while
// the fleet serving it is not saturated, after a wait in its class's queue otherwise. Its class
// and tenant come from the request's headers (FlowRequest). Call it only when FlowControl.
func (s *Service) AdmitFlow(ctx context.Context, model string, h http.Header) (release func(), err error) {
	return s.flow.Admit(ctx, FlowRequest(model, h.Get))
}

// FlowRequest is what flow control knows of a request for model: its class (flow.HeaderPriority)
// and its tenant (the first of flow.TenantHeaders present), read with get from the request's
// HTTP headers or gRPC metadata (whose Get lower-cases the key), so every door reads them alike.
func FlowRequest(model string, get func(key string) string) flow.Request {
	r := flow.Request{Model: model, Priority: get(flow.HeaderPriority)}
	for _, k := range flow.TenantHeaders {
		if r.Tenant = get(k); r.Tenant != "" {
			break
		}
	}
	return r
}
