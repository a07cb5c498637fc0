package tracing_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/prefixmesh/prefixmesh/internal/tracing"
	"github.com/prefixmesh/prefixmesh/internal/tracing/spans"
	"github.com/prefixmesh/prefixmesh/internal/tracing/tracingtest"
)

// clearEnv unsets every variable the rules read, for the rest of the test.
func clearEnv(t *testing.T) {
	for _, k := range []string{tracing.EnvSDKDisabled, tracing.EnvTracesExporter, tracing.EnvEndpoint, tracing.EnvTracesEndpoint,
		tracing.EnvProtocol, tracing.EnvTracesProtocol, "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"} {
		t.Setenv(k, "")
	}
}

func TestFromEnvRules(t *testing.T) {
	for _, c := range []struct {
		name    string
		env     map[string]string
		want    tracing.Settings
		wantErr bool
	}{
		{name: "off by default"},
		{name: "endpoint turns it on, http/protobuf by default", env: map[string]string{tracing.EnvEndpoint: "http://collector:4318"},
			want: tracing.Settings{Enabled: true, Protocol: tracing.ProtocolHTTPProtobuf}},
		{name: "traces endpoint turns it on", env: map[string]string{tracing.EnvTracesEndpoint: "http://collector:4318/v1/traces"},
			want: tracing.Settings{Enabled: true, Protocol: tracing.ProtocolHTTPProtobuf}},
		{name: "exporter otlp turns it on", env: map[string]string{tracing.EnvTracesExporter: "otlp"},
			want: tracing.Settings{Enabled: true, Protocol: tracing.ProtocolHTTPProtobuf}},
		{name: "grpc", env: map[string]string{tracing.EnvEndpoint: "http://c:4317", tracing.EnvProtocol: "grpc"},
			want: tracing.Settings{Enabled: true, Protocol: tracing.ProtocolGRPC}},
		{name: "the traces protocol wins", env: map[string]string{tracing.EnvEndpoint: "http://c:4317", tracing.EnvProtocol: "http/protobuf",
			tracing.EnvTracesProtocol: "grpc"}, want: tracing.Settings{Enabled: true, Protocol: tracing.ProtocolGRPC}},
		{name: "none turns it off", env: map[string]string{tracing.EnvEndpoint: "http://c:4317", tracing.EnvTracesExporter: "none"}},
		{name: "disabled turns it off", env: map[string]string{tracing.EnvTracesExporter: "otlp", tracing.EnvSDKDisabled: "TRUE"}},
		{name: "disabled false keeps it", env: map[string]string{tracing.EnvTracesExporter: "otlp", tracing.EnvSDKDisabled: "false"},
			want: tracing.Settings{Enabled: true, Protocol: tracing.ProtocolHTTPProtobuf}},
		{name: "a bad protocol is an error", env: map[string]string{tracing.EnvEndpoint: "http://c:4317", tracing.EnvProtocol: "http/json"}, wantErr: true},
		{name: "a bad traces protocol is an error", env: map[string]string{tracing.EnvTracesExporter: "otlp", tracing.EnvTracesProtocol: "udp"}, wantErr: true},
		{name: "an unknown exporter is an error", env: map[string]string{tracing.EnvTracesExporter: "zipkin"}, wantErr: true},
		{name: "a bad disabled value is an error", env: map[string]string{tracing.EnvSDKDisabled: "yes"}, wantErr: true},
		{name: "a bad protocol while off is not read", env: map[string]string{tracing.EnvProtocol: "udp"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			clearEnv(t)
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			got, err := tracing.FromEnv()
			if c.wantErr {
				if !errors.Is(err, tracing.ErrEnv) {
					t.Fatalf("FromEnv = %+v, %v; want an ErrEnv error", got, err)
				}
				if _, _, err := tracing.New(context.Background(), tracing.Config{ServiceName: "x"}); !errors.Is(err, tracing.ErrEnv) {
					t.Fatalf("New: %v; want an ErrEnv error", err)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("FromEnv = %+v, %v; want %+v", got, err, c.want)
			}
		})
	}
}

// Off, New hands out the no-op provider, which components recognise and skip.
func TestNewOffIsNoop(t *testing.T) {
	clearEnv(t)
	tp, shutdown, err := tracing.New(context.Background(), tracing.Config{ServiceName: "x"})
	if err != nil {
		t.Fatal(err)
	}
	if spans.Enabled(tp) || spans.Enabled(nil) {
		t.Fatal("the provider of a tracing that is off says it is enabled")
	}
	_, span := tp.Tracer("t").Start(context.Background(), "s")
	if span.IsRecording() {
		t.Fatal("a no-op span records")
	}
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A bad OTEL_RESOURCE_ATTRIBUTES fails at start, with the variable named.
func TestNewBadResource(t *testing.T) {
	clearEnv(t)
	t.Setenv(tracing.EnvTracesExporter, "otlp")
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "no-equals-sign")
	if _, _, err := tracing.New(context.Background(), tracing.Config{ServiceName: "x"}); !errors.Is(err, tracing.ErrEnv) {
		t.Fatalf("New: %v; want an ErrEnv error", err)
	}
}

// Over gRPC to the in-process receiver: the span arrives with the default service name, and
// shutdown flushes what is still batched.
func TestExportGRPC(t *testing.T) {
	clearEnv(t)
	rcv := tracingtest.Start(t)
	rcv.Setenv(t)
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "60000") // only the shutdown's flush can deliver it
	tp, shutdown, err := tracing.New(context.Background(), tracing.Config{ServiceName: "prefixmesh-router", ServiceVersion: "v0"})
	if err != nil {
		t.Fatal(err)
	}
	if !spans.Enabled(tp) {
		t.Fatal("not enabled with an endpoint set")
	}
	_, span := tp.Tracer("t").Start(context.Background(), "hello")
	span.End()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	sp := rcv.Spans()
	if len(sp) != 1 || sp[0].Name != "hello" || sp[0].Service != "prefixmesh-router" {
		t.Fatalf("received:\n%s", tracingtest.Dump(sp))
	}
}

// OTEL_SERVICE_NAME overrides the default name; OTEL_TRACES_SAMPLER keeps its meaning (the SDK
// reads it): always_off exports nothing.
func TestExportEnvOverrides(t *testing.T) {
	clearEnv(t)
	rcv := tracingtest.Start(t)
	rcv.Setenv(t)
	t.Setenv("OTEL_SERVICE_NAME", "router-eu-1")
	tp, shutdown, err := tracing.New(context.Background(), tracing.Config{ServiceName: "prefixmesh-router"})
	if err != nil {
		t.Fatal(err)
	}
	_, span := tp.Tracer("t").Start(context.Background(), "named")
	span.End()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if s := rcv.Spans(); len(s) != 1 || s[0].Service != "router-eu-1" {
		t.Fatalf("received:\n%s", tracingtest.Dump(s))
	}

	t.Setenv("OTEL_TRACES_SAMPLER", "always_off")
	tp, shutdown, err = tracing.New(context.Background(), tracing.Config{ServiceName: "prefixmesh-router"})
	if err != nil {
		t.Fatal(err)
	}
	_, span = tp.Tracer("t").Start(context.Background(), "sampled-out")
	if span.IsRecording() {
		t.Fatal("always_off: the span records")
	}
	span.End()
	if err := shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if s := rcv.Spans(); len(s) != 1 {
		t.Fatalf("always_off exported:\n%s", tracingtest.Dump(s))
	}
}

// http/protobuf, the specification's default protocol, posts to the endpoint's /v1/traces.
func TestExportHTTP(t *testing.T) {
	clearEnv(t)
	var mu sync.Mutex
	var names []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var req collectorpb.ExportTraceServiceRequest
		if r.URL.Path != "/v1/traces" || proto.Unmarshal(b, &req) != nil {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		mu.Lock()
		for _, rs := range req.GetResourceSpans() {
			for _, ss := range rs.GetScopeSpans() {
				for _, s := range ss.GetSpans() {
					names = append(names, s.GetName())
				}
			}
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		out, _ := proto.Marshal(&collectorpb.ExportTraceServiceResponse{})
		_, _ = w.Write(out)
	}))
	defer srv.Close()
	t.Setenv(tracing.EnvEndpoint, srv.URL)
	tp, shutdown, err := tracing.New(context.Background(), tracing.Config{ServiceName: "prefixmesh-router"})
	if err != nil {
		t.Fatal(err)
	}
	_, span := tp.Tracer("t").Start(context.Background(), "over-http")
	span.End()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(names) != 1 || names[0] != "over-http" {
		t.Fatalf("received %v", names)
	}
}
