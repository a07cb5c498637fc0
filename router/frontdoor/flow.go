package frontdoor

import (
	"errors"
	"net/http"

	"github.com/prefixmesh/prefixmesh/router/flow"
)

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
