package extproc

import (
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/prefixmesh/prefixmesh/internal/tracing/spans"
	"github.com/prefixmesh/prefixmesh/router/requests"
)

// tracerName is the endpoint picker's instrumentation scope.
const tracerName = "github.com/prefixmesh/prefixmesh/router/extproc"

// headerMapCarrier reads W3C trace context from the request headers Envoy streams.
type headerMapCarrier struct{ h *corev3.HeaderMap }

func (c headerMapCarrier) Get(key string) string { return headerValue(c.h, key) }
func (c headerMapCarrier) Set(string, string)    {} // never written: the picker answers with mutations
func (c headerMapCarrier) Keys() []string {
	keys := make([]string, 0, len(c.h.GetHeaders()))
	for _, hv := range c.h.GetHeaders() {
		keys = append(keys, hv.GetKey())
	}
	return keys
}

// mutationCarrier collects the trace context as header mutations.
type mutationCarrier []*corev3.HeaderValueOption

func (c *mutationCarrier) Get(string) string { return "" }
func (c *mutationCarrier) Set(key, value string) {
	*c = append(*c, setHeader(key, value))
}
func (c *mutationCarrier) Keys() []string { return nil }

// startSpan starts the request's span, its parent the traceparent among the request headers.
func (st *stream) startSpan(hm *corev3.HeaderMap) {
	ctx := spans.Propagator.Extract(st.ctx, headerMapCarrier{hm})
	method := headerValue(hm, ":method")
	path, _, _ := strings.Cut(st.path, "?")
	name := "ext_proc " + method
	if path == "/v1/completions" || path == "/v1/chat/completions" {
		name += " " + path // the generation routes only: span names stay few
	}
	st.spanCtx, st.span = st.s.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(
		attribute.String("http.request.method", method), attribute.String("url.path", path)))
}

// traceHeaders are the header mutations that make the engine's request carry the picker's span
// as its parent: traceparent (and tracestate, when the trace has one), replacing the client's,
// so that Envoy forwards them to the engine. nil when tracing is off.
func (st *stream) traceHeaders() []*corev3.HeaderValueOption {
	if st.span == nil {
		return nil
	}
	var c mutationCarrier
	spans.Propagator.Inject(st.spanCtx, &c)
	if st.pick != nil && st.span.IsRecording() {
		st.span.SetAttributes(spans.AttrNode.String(st.pick.NodeID), attribute.String("prefixmesh.destination", st.dest))
	}
	return c
}

// served records the node that served, as the gateway reports it.
func (st *stream) served(node string) {
	if st.span != nil && node != "" && st.span.IsRecording() {
		st.span.SetAttributes(spans.AttrServedNode.String(node))
	}
}

// spanError marks the request's span failed with msg, the picker's own words (never the body).
func (st *stream) spanError(msg string) {
	if st.span != nil {
		st.span.SetStatus(codes.Error, msg)
	}
}

// endSpan ends the request's span once, with the response's outcome when a pick was made (pk).
func (st *stream) endSpan(o requests.Outcome, pk *requests.GatewayPick) {
	if st.span == nil {
		return
	}
	if pk != nil && st.span.IsRecording() {
		if o.Status > 0 {
			st.span.SetAttributes(attribute.Int("http.response.status_code", o.Status))
		}
		if o.CachedTokens >= 0 {
			st.span.SetAttributes(spans.AttrCachedTokens.Int(o.CachedTokens))
		}
		switch {
		case o.Err != nil:
			st.span.SetStatus(codes.Error, o.Err.Error())
		case o.Status >= 500:
			st.span.SetStatus(codes.Error, "status "+strconv.Itoa(o.Status))
		}
	}
	st.span.End()
	st.span, st.spanCtx = nil, nil
}
