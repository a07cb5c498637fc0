package router

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/prefixmesh/prefixmesh/internal/tracing/spans"
	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
)

// tracerName is the gRPC Route's instrumentation scope.
const tracerName = "github.com/prefixmesh/prefixmesh/router"

// routeSpanName is the span name of a Route call, as gRPC instrumentations name RPC spans.
var routeSpanName = pb.Router_ServiceDesc.ServiceName + "/Route"

// metadataCarrier reads and writes W3C trace context in gRPC metadata (keys are lower case
// there, as the propagator asks for them).
type metadataCarrier metadata.MD

func (c metadataCarrier) Get(key string) string {
	if v := metadata.MD(c).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c metadataCarrier) Set(key, value string) { metadata.MD(c).Set(key, value) }

func (c metadataCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// routeSpan starts a Route call's server span, its parent the caller's traceparent from the
// incoming metadata (done here rather than by a stats handler: one method, no dependency).
func (s *Server) routeSpan(ctx context.Context) (context.Context, trace.Span) {
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		ctx = spans.Propagator.Extract(ctx, metadataCarrier(md))
	}
	return s.tracer.Start(ctx, routeSpanName, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(
		attribute.String("rpc.system", "grpc"), attribute.String("rpc.service", pb.Router_ServiceDesc.ServiceName),
		attribute.String("rpc.method", "Route")))
}

// endRouteSpan ends the call's span with its gRPC status.
func endRouteSpan(span trace.Span, req *pb.RouteRequest, err error) {
	if span.IsRecording() {
		st, _ := status.FromError(err)
		span.SetAttributes(attribute.Int("rpc.grpc.status_code", int(st.Code())), spans.AttrDryRun.Bool(req.GetDryRun()))
		if err != nil {
			// The code alone: a tokenizer's message within the status may quote the prompt.
			span.SetStatus(otelcodes.Error, st.Code().String())
		}
	}
	span.End()
}

// tokenizeSpan starts the span of tokenising a text prompt, nil when tracing is off.
func (s *Server) tokenizeSpan(ctx context.Context) trace.Span {
	if !s.tracing {
		return nil
	}
	_, span := s.tracer.Start(ctx, spans.SpanTokenize)
	return span
}

// tokenized ends a tokenize span (nil: none) with the prompt's length, or failed.
func tokenized(span trace.Span, n int, err error) {
	if span == nil {
		return
	}
	if err != nil {
		span.SetStatus(otelcodes.Error, "tokenize failed") // not err's text: it may quote the prompt
	} else if span.IsRecording() {
		span.SetAttributes(spans.AttrPromptTokens.Int(n))
	}
	span.End()
}
