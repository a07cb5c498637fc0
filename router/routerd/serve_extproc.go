package routerd

import (
	"context"
	"fmt"
	"log/slog"
	"net"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/prefixmesh/prefixmesh/internal/connstats"
	"github.com/prefixmesh/prefixmesh/router/extproc"
	"github.com/prefixmesh/prefixmesh/router/frontdoor"
)

// maxExtProcFallbacks bounds --ext-proc-fallbacks: a gateway's retry budget is a few attempts,
// and every endpoint listed is a candidate scored for nothing if it is never tried.
const maxExtProcFallbacks = 8

// endpointPicker is the Gateway API Inference Extension endpoint picker on its own listener:
// ext_proc over the front door's decision path (its Server: parse, tokenizer, pinned picker,
// in-flight accounting), with grpc.health.v1 for liveness, readiness and ext_proc.
type endpointPicker struct {
	epp   *extproc.Server
	srv   *grpc.Server
	lis   net.Listener
	conns *connstats.Counter
}

// newEndpointPicker listens on cfg.ExtProcListen; nil when the flag is off.
func newEndpointPicker(cfg ServeConfig, t tlsSetup, fd *frontDoor, mirror frontdoor.Mirror, conns *connstats.Counter,
	reg *prometheus.Registry, logger *slog.Logger) (*endpointPicker, error) {
	if cfg.ExtProcListen == "" {
		return nil, nil
	}
	ecfg := extproc.DefaultConfig()
	ecfg.Fallbacks = cfg.ExtProcFallbacks
	epp, err := extproc.New(ecfg, extproc.Deps{Picker: fd.Server, Nodes: frontdoor.MirrorNodes{M: mirror},
		Registry: reg, Logger: logger})
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", cfg.ExtProcListen)
	if err != nil {
		return nil, fmt.Errorf("ext-proc listen: %w", err)
	}
	opts := append(epp.GRPCOptions(), grpc.Creds(t.grpcServerCreds()), grpc.StatsHandler(conns.StatsHandler()))
	srv := grpc.NewServer(opts...)
	epp.Register(srv)
	return &endpointPicker{epp: epp, srv: srv, lis: lis, conns: conns}, nil
}

// addr is the bound address, for the addr file and the log.
func (e *endpointPicker) addr() string { return e.lis.Addr().String() }

// serve serves until shutdown; its exit goes to served (nil for a requested stop).
func (e *endpointPicker) serve(served chan<- error) {
	go func() { served <- serveErr("ext-proc", e.srv.Serve(e.conns.Listener(e.lis))) }()
}

// shutdown reports NOT_SERVING, lets the streams in flight finish within ctx, then cuts the rest
// (each cut request is counted as failed and its in-flight count given back).
func (e *endpointPicker) shutdown(ctx context.Context, logger *slog.Logger) {
	e.epp.Shutdown()
	done := make(chan struct{})
	go func() { e.srv.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		logger.Warn("endpoint picker drain incomplete; closing streams", "streams", e.epp.Streams())
		e.srv.Stop()
		<-done
	}
}
