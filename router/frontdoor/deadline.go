package frontdoor

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/prefixmesh/prefixmesh/router/requests"
)

// firstByteSlack multiplies a node's expected TTFT into its first-byte deadline: the estimate
// comes from a load report up to a second old and, for nodes that report none, a default prefill
// rate, so a healthy node may well take a few times longer; 4× still cuts off a hung node after a
// few expected TTFTs (and never before Config.FirstByteFloor).
const firstByteSlack = 4

// firstByteTimeout is the wait for a streaming attempt's response headers on the picked node:
// firstByteSlack × its expected TTFT (requests.ExpectedTTFT), clamped.
func (s *Server) firstByteTimeout(pk requests.Pick) time.Duration {
	return min(max(firstByteSlack*pk.ExpectedTTFT, s.cfg.FirstByteFloor), s.cfg.FirstByteCeiling)
}

// Causes an attempt's context is cancelled with, so the proxy can tell its own deadlines from the
// client going away.
var (
	errFirstByteTimeout = errors.New("no response from the engine within the first-byte deadline")
	errIdleTimeout      = errors.New("the stream sent nothing within the idle deadline")
	errUpstreamTimeout  = errors.New("the upstream request exceeded UpstreamTimeout")
	errDrainCut         = errors.New("the router's drain deadline passed")
)

// attempt is one try on one node: its context, cancelled with a cause by the client going away,
// the drain deadline, UpstreamTimeout or the first-byte and idle watchdogs.
type attempt struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	// stopDrain unhooks the attempt from the server's stop context; timers are its watchdogs
	// and UpstreamTimeout's (at most three: held in place, no allocation to list them).
	stopDrain func() bool
	timers    []*time.Timer
	timerBuf  [3]*time.Timer
	// span is the attempt's upstream span and firstByte the span under it that ends at the
	// first byte or token (trace.go); nopSpan when tracing is off.
	span, firstByte trace.Span
	ended           bool // end ran: a second call does nothing
}

func (s *Server) newAttempt(parent context.Context) *attempt {
	a := &attempt{}
	a.timers = a.timerBuf[:0]
	a.ctx, a.cancel = context.WithCancelCause(parent)
	a.stopDrain = context.AfterFunc(s.stop, func() { a.cancel(errDrainCut) })
	if s.cfg.UpstreamTimeout > 0 {
		a.timers = append(a.timers, time.AfterFunc(s.cfg.UpstreamTimeout, func() { a.cancel(errUpstreamTimeout) }))
	}
	return a
}

// watchdog cancels the attempt with cause unless reset (Reset) or stopped within d.
func (a *attempt) watchdog(d time.Duration, cause error) *time.Timer {
	t := time.AfterFunc(d, func() { a.cancel(cause) })
	a.timers = append(a.timers, t)
	return t
}

// cause is why the attempt's context ended, nil while it runs.
func (a *attempt) cause() error {
	if a.ctx.Err() == nil {
		return nil
	}
	return context.Cause(a.ctx)
}

// end releases the attempt's timers and context, and ends its spans (if not ended already).
// Only the first call does anything, so a path that may or may not have ended the attempt can
// end it again safely. Called by the request's goroutine only.
func (a *attempt) end() {
	if a.ended {
		return
	}
	a.ended = true
	a.stopDrain()
	for _, t := range a.timers {
		t.Stop()
	}
	a.cancel(context.Canceled)
	a.firstByte.End()
	a.span.End()
}
