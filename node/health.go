package node

import (
	"context"
	"sync"

	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// Health is grpc.health.v1 for a daemon that drains: a health.Server whose Watch streams end
// when Drain is called. grpc-go's own Watch streams stay open until the client leaves, and
// grpc.Server.GracefulStop waits for every open stream, so one watching router or load balancer
// would hold every shutdown for the whole drain timeout. Drain reports NOT_SERVING to every
// watcher (exactly once more, if it has not seen it) and then ends its stream cleanly.
type Health struct {
	*health.Server

	drainOnce sync.Once
	drainCtx  context.Context // done once Drain is called
	drain     context.CancelFunc
}

var _ healthpb.HealthServer = (*Health)(nil)

// NewHealth returns a Health whose overall status ("") and listed services start NOT_SERVING.
func NewHealth(services ...string) *Health {
	ctx, cancel := context.WithCancel(context.Background())
	h := &Health{Server: health.NewServer(), drainCtx: ctx, drain: cancel}
	for _, s := range append([]string{""}, services...) {
		h.SetServingStatus(s, healthpb.HealthCheckResponse_NOT_SERVING)
	}
	return h
}

// SetServing sets every listed service and the overall status to SERVING or NOT_SERVING.
func (h *Health) SetServing(serving bool, services ...string) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if serving {
		st = healthpb.HealthCheckResponse_SERVING
	}
	for _, s := range append([]string{""}, services...) {
		h.SetServingStatus(s, st)
	}
}

// Drain sets every service NOT_SERVING for good and ends all Watch streams, current and future,
// after telling each watcher NOT_SERVING. Call it before grpc.Server.GracefulStop.
func (h *Health) Drain() {
	h.drainOnce.Do(func() {
		h.Shutdown()
		h.drain()
	})
}

// Watch implements grpc.health.v1 Watch, ending the stream (with status OK, after a final
// NOT_SERVING) once Drain is called.
func (h *Health) Watch(req *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	stop := context.AfterFunc(h.drainCtx, cancel)
	defer stop()
	ws := &watchStream{Health_WatchServer: stream, ctx: ctx, last: -1}
	err := h.Server.Watch(req, ws)
	if h.drainCtx.Err() == nil || stream.Context().Err() != nil {
		return err // the client left, or the stream failed: nothing more to say
	}
	if ws.last != healthpb.HealthCheckResponse_NOT_SERVING && ws.last != healthpb.HealthCheckResponse_SERVICE_UNKNOWN {
		if err := stream.Send(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_NOT_SERVING}); err != nil {
			return err
		}
	}
	return nil
}

// watchStream gives the inner Watch a context that ends on Drain and records the last status it
// sent. The inner Watch sends from its own goroutine only, and has returned before the outer
// Watch reads last.
type watchStream struct {
	healthpb.Health_WatchServer
	ctx  context.Context
	last healthpb.HealthCheckResponse_ServingStatus
}

func (w *watchStream) Context() context.Context { return w.ctx }

func (w *watchStream) Send(r *healthpb.HealthCheckResponse) error {
	w.last = r.GetStatus()
	return w.Health_WatchServer.Send(r)
}
