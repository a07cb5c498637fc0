// Package tracing builds the OpenTelemetry TracerProvider of the prefixmesh daemons from the
// standard OpenTelemetry environment variables. Tracing is off unless the environment asks for it
// (OTEL_TRACES_EXPORTER=otlp, or an OTLP endpoint is set); off, New returns the no-op provider and
// the components it is handed skip span work altogether (spans.Enabled), so the routing hot path
// costs nothing. On, spans go to an OTLP exporter (gRPC or HTTP/protobuf) through a batch span
// processor; the SDK's own variables (OTLP endpoint, headers, TLS, timeout, compression,
// OTEL_TRACES_SAMPLER, OTEL_BSP_*) keep their standard meaning. Nothing here touches otel's
// global provider: each component takes its provider in its Config. The names and attributes the
// doors' spans share are in internal/tracing/spans, which does not link the exporters.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// The environment variables New reads itself; the exporters and the SDK read the rest.
const (
	EnvSDKDisabled    = "OTEL_SDK_DISABLED"
	EnvTracesExporter = "OTEL_TRACES_EXPORTER"
	EnvEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	EnvProtocol       = "OTEL_EXPORTER_OTLP_PROTOCOL"
	EnvTracesProtocol = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
)

// OTLP protocols. The specification's default is http/protobuf; http/json is not offered by the
// Go exporters, so it is refused rather than silently sent as protobuf.
const (
	ProtocolGRPC         = "grpc"
	ProtocolHTTPProtobuf = "http/protobuf"
)

// DefaultShutdownTimeout bounds Shutdown's flush when its context has no deadline: a collector
// that does not take a batch within 5 s is down, and a stopping daemon should not wait for it.
const DefaultShutdownTimeout = 5 * time.Second

// Config is what the caller knows that the environment does not.
type Config struct {
	// ServiceName is service.name unless OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES set it.
	ServiceName string
	// ServiceVersion, when set, is service.version (the environment can override it).
	ServiceVersion string
	// Logger, when set, receives the SDK's export errors (a collector that is down) at warn
	// level instead of the standard logger.
	Logger *slog.Logger
}

// Settings is what the environment asks for.
type Settings struct {
	Enabled  bool
	Protocol string // ProtocolGRPC or ProtocolHTTPProtobuf; "" when not enabled
}

// ErrEnv is wrapped by every error about the environment's values.
var ErrEnv = errors.New("tracing: invalid OpenTelemetry environment")

// FromEnv reads the settings from the process environment: on when OTEL_TRACES_EXPORTER is otlp,
// or when it is unset and an OTLP endpoint is set; off when OTEL_SDK_DISABLED is true or
// OTEL_TRACES_EXPORTER is none. A value it does not know is an error, so a typo does not turn
// tracing silently off.
func FromEnv() (Settings, error) {
	switch v := strings.ToLower(strings.TrimSpace(os.Getenv(EnvSDKDisabled))); v {
	case "true":
		return Settings{}, nil
	case "", "false":
	default:
		return Settings{}, fmt.Errorf("%w: %s=%q: want true or false", ErrEnv, EnvSDKDisabled, v)
	}
	on := false
	switch v := strings.TrimSpace(os.Getenv(EnvTracesExporter)); v {
	case "none":
		return Settings{}, nil
	case "otlp":
		on = true
	case "":
		on = os.Getenv(EnvEndpoint) != "" || os.Getenv(EnvTracesEndpoint) != ""
	default:
		return Settings{}, fmt.Errorf("%w: %s=%q: only otlp and none are supported", ErrEnv, EnvTracesExporter, v)
	}
	if !on {
		return Settings{}, nil
	}
	p := strings.TrimSpace(os.Getenv(EnvTracesProtocol))
	name := EnvTracesProtocol
	if p == "" {
		p, name = strings.TrimSpace(os.Getenv(EnvProtocol)), EnvProtocol
	}
	switch p {
	case "":
		p = ProtocolHTTPProtobuf
	case ProtocolGRPC, ProtocolHTTPProtobuf:
	default:
		return Settings{}, fmt.Errorf("%w: %s=%q: want %s or %s", ErrEnv, name, p, ProtocolGRPC, ProtocolHTTPProtobuf)
	}
	return Settings{Enabled: true, Protocol: p}, nil
}

// New builds the TracerProvider the environment asks for and the function that flushes and
// stops it (bounded by its context's deadline, or DefaultShutdownTimeout without one). Off, the
// provider is the no-op one and shutdown does nothing. The exporter does not connect here: a
// collector that is down costs dropped spans and a warning per failed batch, never a failed
// start.
func New(ctx context.Context, cfg Config) (trace.TracerProvider, func(context.Context) error, error) {
	nop := func(context.Context) error { return nil }
	st, err := FromEnv()
	if err != nil {
		return nil, nil, err
	}
	if !st.Enabled {
		return noop.NewTracerProvider(), nop, nil
	}
	attrs := []attribute.KeyValue{attribute.String("service.name", cfg.ServiceName)}
	if cfg.ServiceVersion != "" {
		attrs = append(attrs, attribute.String("service.version", cfg.ServiceVersion))
	}
	// Later detectors win: the environment's service name and attributes override the defaults.
	res, err := resource.New(ctx, resource.WithAttributes(attrs...), resource.WithTelemetrySDK(), resource.WithFromEnv())
	if err != nil {
		return nil, nil, fmt.Errorf("%w: resource (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES): %w", ErrEnv, err)
	}
	// No options: each exporter reads its endpoint, headers, TLS, timeout and compression from
	// the OTEL_EXPORTER_OTLP_* variables itself.
	var exp sdktrace.SpanExporter
	if st.Protocol == ProtocolGRPC {
		exp, err = otlptracegrpc.New(ctx)
	} else {
		exp, err = otlptracehttp.New(ctx)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("tracing: OTLP %s exporter: %w", st.Protocol, err)
	}
	if cfg.Logger != nil {
		// The SDK reports export failures only to otel's error handler, a process-wide setting.
		lg := cfg.Logger
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { lg.Warn("tracing export", "err", err) }))
	}
	// No sampler or batch options: NewTracerProvider reads OTEL_TRACES_SAMPLER(_ARG) and the
	// batch processor OTEL_BSP_*.
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	shutdown := func(ctx context.Context) error {
		if _, ok := ctx.Deadline(); !ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, DefaultShutdownTimeout)
			defer cancel()
		}
		return tp.Shutdown(ctx)
	}
	return tp, shutdown, nil
}
