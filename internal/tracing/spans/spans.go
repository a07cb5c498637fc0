// Package spans is what the router's doors share to make spans, apart from the provider's setup
// (internal/tracing) so that they do not link the OTLP exporters: whether a provider records
// (Enabled, for a hot path that skips span work otherwise), the one propagation format (W3C trace
// context), and the span names and decision attributes every door uses. No attribute carries
// prompt content.
package spans

import (
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Propagator is the one propagation format of every door: W3C trace context (traceparent,
// tracestate).
var Propagator = propagation.TraceContext{}

// Enabled reports whether tp records anything: false for nil and the no-op provider, so that a
// component handed either skips span work on its hot path.
func Enabled(tp trace.TracerProvider) bool {
	switch tp.(type) {
	case nil, noop.TracerProvider:
		return false
	}
	return true
}

// Tracer is tp's tracer for a component (instrumentation scope name), the no-op tracer for nil.
func Tracer(tp trace.TracerProvider, name string) trace.Tracer {
	if tp == nil {
		return noop.NewTracerProvider().Tracer(name)
	}
	return tp.Tracer(name)
}

// Span attributes of the routing decision, the same on every door. None carries prompt content:
// counts, node ids and the policy's own words only.
const (
	AttrNode             = attribute.Key("prefixmesh.node")
	AttrPolicy           = attribute.Key("prefixmesh.policy")
	AttrReason           = attribute.Key("prefixmesh.reason")
	AttrEstimatedMatched = attribute.Key("prefixmesh.estimated_matched_tokens")
	AttrPredictedTTFT    = attribute.Key("prefixmesh.predicted_ttft_s")
	AttrPromptTokens     = attribute.Key("prefixmesh.prompt_tokens")
	AttrAttempt          = attribute.Key("prefixmesh.attempt")
	AttrDryRun           = attribute.Key("prefixmesh.dry_run")
	AttrServedNode       = attribute.Key("prefixmesh.served_node")
	AttrCachedTokens     = attribute.Key("prefixmesh.cached_tokens")
)

// Span names shared by the doors.
const (
	SpanAdmission = "admission"
	SpanTokenize  = "tokenize"
	SpanDecide    = "decide"
	SpanUpstream  = "upstream"
	SpanFirstByte = "first_byte"
)

// Decision is the decide span's attributes: the chosen node, the policy and its reason, the
// estimated matched tokens, the predicted time to first token and the prompt's length (-1:
// unknown, left out).
func Decision(span trace.Span, node, policy, reason string, estimated int, predictedTTFT time.Duration, promptTokens int) {
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(AttrNode.String(node), AttrPolicy.String(policy), AttrReason.String(reason),
		AttrEstimatedMatched.Int(estimated), AttrPredictedTTFT.Float64(predictedTTFT.Seconds()))
	if promptTokens >= 0 {
		span.SetAttributes(AttrPromptTokens.Int(promptTokens))
	}
}
