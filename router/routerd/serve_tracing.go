package routerd

import (
	"context"

	"github.com/prefixmesh/prefixmesh/internal/buildinfo"
	"github.com/prefixmesh/prefixmesh/internal/tracing"
	"github.com/prefixmesh/prefixmesh/internal/tracing/spans"
)

// serviceName is the router's service.name in traces unless OTEL_SERVICE_NAME says otherwise.
const serviceName = "prefixmesh-router"

// startTracing builds the tracer provider the OpenTelemetry environment asks for (off by
// default: the no-op provider, and the doors make no spans) before any door is built, since each
// door takes it in its config.
func (d *routerd) startTracing(ctx context.Context) error {
	tp, shutdown, err := tracing.New(ctx, tracing.Config{ServiceName: serviceName, ServiceVersion: buildinfo.Version(),
		Logger: d.logger.With("component", "tracing")})
	if err != nil {
		return err
	}
	d.tracer, d.stopTracing = tp, shutdown
	if spans.Enabled(tp) {
		st, _ := tracing.FromEnv() // New just read it without error
		d.logger.Info("tracing on", "protocol", st.Protocol)
	}
	d.onFail(d.flushTracing)
	return nil
}

// flushTracing exports the spans still batched and stops the exporter, within
// tracing.DefaultShutdownTimeout of its own: it runs once the doors have stopped, when the
// drain's deadline may already be spent, and the last requests' spans are the ones worth having.
func (d *routerd) flushTracing() {
	if d.stopTracing == nil {
		return
	}
	stop := d.stopTracing
	d.stopTracing = nil
	ctx, cancel := context.WithTimeout(context.Background(), tracing.DefaultShutdownTimeout)
	defer cancel()
	if err := stop(ctx); err != nil {
		d.logger.Warn("tracing flush", "err", err)
	}
}
