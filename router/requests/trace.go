package requests

import (
	"context"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/prefixmesh/prefixmesh/internal/tracing/spans"
)

// tracerName is the request service's instrumentation scope.
const tracerName = "github.com/prefixmesh/prefixmesh/router/requests"

// nopSpan is the span every span helper returns while tracing is off: a static non-recording
// value, so the code reads the same either way and allocates nothing for it.
var nopSpan = trace.SpanFromContext(context.Background())

// decideSpan starts the span of a decision under ctx's, or returns ctx and nopSpan when tracing
// is off.
func (s *Service) decideSpan(ctx context.Context) (context.Context, trace.Span) {
	if !s.tracing {
		return ctx, nopSpan
	}
	return s.tracer.Start(ctx, spans.SpanDecide, trace.WithSpanKind(trace.SpanKindInternal))
}

// decideFailed ends a decide span with the picker's error (its own words, never the prompt).
func decideFailed(span trace.Span, err error) {
	if span.IsRecording() {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// decided records a pick on its decide span (spans.Decision's attributes, and the attempt when
// positive) and ends it; promptTokens is -1 when the prompt was not tokenised.
func decided(span trace.Span, pk *Pick, promptTokens, attempt int) {
	if !span.IsRecording() {
		return
	}
	spans.Decision(span, pk.NodeID, pk.Policy, pk.Reason, pk.EstimatedMatchedTokens, pk.ExpectedTTFT, promptTokens)
	if attempt > 0 {
		span.SetAttributes(spans.AttrAttempt.Int(attempt))
	}
	span.End()
}

// tokenizeSpan starts the span of the router tokenising a text or chat prompt (nopSpan for a
// prompt of token ids: nothing is tokenised).
func (s *Service) tokenizeSpan(ctx context.Context, g *GenRequest) (context.Context, trace.Span) {
	if !s.tracing || (!g.Chat && g.Tokens != nil) {
		return ctx, nopSpan
	}
	return s.tracer.Start(ctx, spans.SpanTokenize)
}

// tokenized ends the tokenize span with the prompt's length, or err.
func tokenized(span trace.Span, n int, err error) {
	if !span.IsRecording() {
		return
	}
	if err != nil {
		// Not err's text: a tokenizer's or template's message may quote the prompt.
		span.SetStatus(codes.Error, "tokenize failed")
	} else {
		span.SetAttributes(spans.AttrPromptTokens.Int(n))
	}
	span.End()
}
