package frontdoor

import (
	"context"
	"errors"
	"net/http"

	"github.com/prefixmesh/prefixmesh/router/flow"
)

// FlowControl reports whether the front door runs flow control (Deps.Flow): the endpoint picker
// then passes the headers flow control reads.
func (s *Server) FlowControl() bool { return s.flow != nil }

// admitFlow asks flow control to let a request for model through (router/flow): at once while
// the fleet serving it is not saturated, after a wait in its class's queue otherwise. Its class
// and tenant come from the request's headers (flow.HeaderPriority, flow.TenantHeaders).
func (s *Server) admitFlow(ctx context.Context, model string, h http.Header) (func(), error) {
	return s.flow.Admit(ctx, flow.Request{Model: model, Priority: h.Get(flow.HeaderPriority), Tenant: flow.TenantOf(h)})
}

// flowRefused answers a request flow control did not admit: 429 with Retry-After and the reason
// for a shed request, the decision's own 503 when no node serves the model, nothing when the
// client left while it waited.
func (s *Server) flowRefused(w http.ResponseWriter, r *http.Request, err error, lg *reqLog) {
	lg.err = err.Error()
	var se *flow.ShedError
	switch {
	case errors.As(err, &se):
		w.Header().Set("Retry-After", flow.RetryAfterSeconds)
		w.Header().Set(flow.HeaderDroppedReason, string(se.Reason))
		writeError(w, http.StatusTooManyRequests, codeOverloaded, se.Error())
	case errors.Is(err, flow.ErrNoNodes):
		writeError(w, http.StatusServiceUnavailable, codeNoNodes, "no node can serve this request: none serves its model")
	case r.Context().Err() != nil:
		lg.err = "client went away"
	default:
		writeError(w, http.StatusInternalServerError, "internal_error", err.Error())
	}
}
