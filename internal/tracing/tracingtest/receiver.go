// Package tracingtest is an in-process OTLP trace receiver for tests: a real gRPC server on a
// loopback port implementing the OTLP TraceService, which records every span exported to it, so a
// test can point the real exporter (internal/tracing, through the environment) at it and assert
// on the spans as a collector would receive them.
package tracingtest

import (
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
)

// Span is one received span, flattened for assertions.
type Span struct {
	Name          string
	TraceID       string // hex
	SpanID        string // hex
	ParentSpanID  string // hex, "" for a root span
	Kind          tracepb.Span_SpanKind
	Attrs         map[string]any // string, int64, float64 or bool
	StatusCode    tracepb.Status_StatusCode
	StatusMessage string
	Service       string // the resource's service.name
	Start, End    time.Time
}

// Receiver records the spans exported to it.
type Receiver struct {
	collectorpb.UnimplementedTraceServiceServer

	// Addr is the receiver's host:port.
	Addr string

	mu      sync.Mutex
	spans   []Span
	changed chan struct{} // closed and replaced whenever spans arrive
}

// Start serves a receiver on 127.0.0.1:0 until the test ends.
func Start(t testing.TB) *Receiver {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &Receiver{Addr: lis.Addr().String(), changed: make(chan struct{})}
	srv := grpc.NewServer()
	collectorpb.RegisterTraceServiceServer(srv, r)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return r
}

// Setenv points the OTLP exporter at r over gRPC for the rest of the test (t.Setenv), and makes
// the batch processor export every 10 ms so that spans ended after a request arrive promptly.
func (r *Receiver) Setenv(t *testing.T) {
	t.Setenv("OTEL_SDK_DISABLED", "")
	t.Setenv("OTEL_TRACES_EXPORTER", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+r.Addr)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "10")
	t.Setenv("OTEL_TRACES_SAMPLER", "always_on")
}

// Export implements the OTLP TraceService.
func (r *Receiver) Export(_ context.Context, req *collectorpb.ExportTraceServiceRequest) (*collectorpb.ExportTraceServiceResponse, error) {
	var got []Span
	for _, rs := range req.GetResourceSpans() {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				sp := Span{Name: s.GetName(), TraceID: hex.EncodeToString(s.GetTraceId()), SpanID: hex.EncodeToString(s.GetSpanId()),
					ParentSpanID: hex.EncodeToString(s.GetParentSpanId()), Kind: s.GetKind(), Attrs: map[string]any{},
					StatusCode: s.GetStatus().GetCode(), StatusMessage: s.GetStatus().GetMessage(), Service: service,
					Start: time.Unix(0, int64(s.GetStartTimeUnixNano())), End: time.Unix(0, int64(s.GetEndTimeUnixNano()))}
				for _, kv := range s.GetAttributes() {
					sp.Attrs[kv.GetKey()] = value(kv.GetValue())
				}
				got = append(got, sp)
			}
		}
	}
	r.mu.Lock()
	r.spans = append(r.spans, got...)
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
	return &collectorpb.ExportTraceServiceResponse{}, nil
}

func value(v *commonpb.AnyValue) any {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return x.IntValue
	case *commonpb.AnyValue_DoubleValue:
		return x.DoubleValue
	case *commonpb.AnyValue_BoolValue:
		return x.BoolValue
	}
	return v.String()
}

// Spans returns a copy of the spans received so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// Wait returns the spans received once ok accepts them, failing the test if it has not within
// timeout.
func (r *Receiver) Wait(t testing.TB, timeout time.Duration, what string, ok func([]Span) error) []Span {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		spans := append([]Span(nil), r.spans...)
		changed := r.changed
		r.mu.Unlock()
		err := ok(spans)
		if err == nil {
			return spans
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("%s: not within %v: %v; spans received:\n%s", what, timeout, err, Dump(spans))
			return nil
		}
	}
}

// Dump lists spans one per line, for failure messages.
func Dump(spans []Span) string {
	var b strings.Builder
	for _, s := range spans {
		fmt.Fprintf(&b, "  %s trace=%s span=%s parent=%s kind=%v status=%v attrs=%v\n", s.Name, s.TraceID, s.SpanID, s.ParentSpanID, s.Kind, s.StatusCode, s.Attrs)
	}
	return b.String()
}

// Named returns the spans called name, in the order received.
func Named(spans []Span, name string) []Span {
	var out []Span
	for _, s := range spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// Children returns the spans whose parent is parent, in the order received.
func Children(spans []Span, parent Span) []Span {
	var out []Span
	for _, s := range spans {
		if s.ParentSpanID == parent.SpanID && s.TraceID == parent.TraceID {
			out = append(out, s)
		}
	}
	return out
}

// InTrace returns the spans of trace id.
func InTrace(spans []Span, traceID string) []Span {
	var out []Span
	for _, s := range spans {
		if s.TraceID == traceID {
			out = append(out, s)
		}
	}
	return out
}
