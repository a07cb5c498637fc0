package frontdoor

import (
	"context"
	"net/http"
	"net/url"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/prefixmesh/prefixmesh/internal/tracing/spans"
	"github.com/prefixmesh/prefixmesh/router/requests"
)

// tracerName is the front door's instrumentation scope.
const tracerName = "github.com/prefixmesh/prefixmesh/router/frontdoor"

// nopSpan is the span every span helper returns while tracing is off: a static non-recording
// value, so the proxy's code reads the same either way and allocates nothing for it.
var nopSpan = trace.SpanFromContext(context.Background())

// startSpan starts an internal span under ctx's, or returns ctx and nopSpan when tracing is off.
func (s *Server) startSpan(ctx context.Context, name string, kind trace.SpanKind) (context.Context, trace.Span) {
	if !s.tracing {
		return ctx, nopSpan
	}
	return s.tracer.Start(ctx, name, trace.WithSpanKind(kind))
}

// serverSpan starts a generation request's server span, its parent taken from the client's
// traceparent, and returns r carrying it.
func (s *Server) serverSpan(r *http.Request, name, path string) (*http.Request, trace.Span) {
	if !s.tracing {
		return r, nopSpan
	}
	ctx := spans.Propagator.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	ctx, span := s.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(
		attribute.String("http.request.method", r.Method), attribute.String("http.route", path),
		attribute.String("client.address", r.RemoteAddr)))
	return r.WithContext(ctx), span
}

// endServerSpan ends the request's span with the status the client got.
func endServerSpan(span trace.Span, status int) {
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(attribute.Int("http.response.status_code", status))
	if status >= 500 {
		span.SetStatus(codes.Error, http.StatusText(status))
	}
	span.End()
}

// spanError marks span failed with msg (never prompt content: the proxy's own messages).
func spanError(span trace.Span, msg string) {
	if span.IsRecording() {
		span.SetStatus(codes.Error, msg)
	}
}

// admitted ends the admission span of a request whose body of n bytes was read and parsed.
func admitted(span trace.Span, n int) {
	if span.IsRecording() {
		span.SetAttributes(attribute.Int("http.request.body.size", n))
	}
	span.End()
}

// startUpstream starts an attempt's client span toward pk's engine and, under it, the span that
// ends at the first byte (a streamed answer: the first output token relayed); the attempt's
// context derives from it, so the request to the engine carries its traceparent.
func (s *Server) startUpstream(ctx context.Context, pk *requests.Pick, attempt int) *attempt {
	if !s.tracing {
		at := s.newAttempt(ctx)
		at.span, at.firstByte = nopSpan, nopSpan
		return at
	}
	attrs := []attribute.KeyValue{spans.AttrNode.String(pk.NodeID), spans.AttrAttempt.Int(attempt),
		attribute.String("http.request.method", http.MethodPost)}
	if u, err := url.Parse(pk.EngineURL); err == nil {
		attrs = append(attrs, attribute.String("server.address", u.Hostname()))
		if p, err := strconv.Atoi(u.Port()); err == nil {
			attrs = append(attrs, attribute.Int("server.port", p))
		}
	}
	ctx, span := s.tracer.Start(ctx, spans.SpanUpstream, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	at := s.newAttempt(ctx)
	at.span = span
	_, at.firstByte = s.tracer.Start(ctx, spans.SpanFirstByte)
	return at
}

// upstreamStatus records the engine's answer on the attempt's span; a 5xx or 429 fails it.
func (a *attempt) upstreamStatus(status int) {
	if !a.span.IsRecording() {
		return
	}
	a.span.SetAttributes(attribute.Int("http.response.status_code", status))
	if status >= 500 || status == http.StatusTooManyRequests {
		a.span.SetStatus(codes.Error, http.StatusText(status))
		a.firstByte.SetStatus(codes.Error, http.StatusText(status))
	}
}

// failed marks the attempt's spans failed with err and ends them.
func (a *attempt) failed(err error) {
	if !a.span.IsRecording() {
		return
	}
	a.firstByte.SetStatus(codes.Error, err.Error())
	a.firstByte.End()
	a.span.SetStatus(codes.Error, err.Error())
	a.span.End()
}

// onFirstToken is what the relay calls at the first output token: the pick's FirstToken, and the
// end of the first_byte span when spans.
func (a *attempt) onFirstToken(first func()) func() {
	if !a.firstByte.IsRecording() {
		return first
	}
	return func() {
		a.firstByte.End()
		if first != nil {
			first()
		}
	}
}

// injectTrace replaces any traceparent and tracestate the client sent with the attempt's own, so
// the engine's spans hang under the upstream attempt (in the client's trace, when it sent one).
func (s *Server) injectTrace(ctx context.Context, h http.Header) {
	if !s.tracing {
		return
	}
	h.Del("Traceparent")
	h.Del("Tracestate")
	spans.Propagator.Inject(ctx, propagation.HeaderCarrier(h))
}

// traceID is the request's trace id for its log line, "" when tracing is off.
func (s *Server) traceID(ctx context.Context) string {
	if !s.tracing {
		return ""
	}
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		return sc.TraceID().String()
	}
	return ""
}
