package extproc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/prefixmesh/prefixmesh/internal/bytebudget"
	"github.com/prefixmesh/prefixmesh/internal/tracing/spans"
	"github.com/prefixmesh/prefixmesh/router/requests"
)

// Picker decides for a gateway; the request service (*requests.Service) implements it, so the
// endpoint picker takes every door's decision path.
type Picker interface {
	PickForGateway(ctx context.Context, r *requests.GatewayRequest) (*requests.GatewayPick, error)
}

var _ Picker = (*requests.Service)(nil)

// Health service names the endpoint picker answers on grpc.health.v1, as GIE's protocol lists
// them: liveness (the process answers), readiness and the ext_proc service (the node view has
// synced).
const (
	ServiceLiveness  = "liveness"
	ServiceReadiness = "readiness"
)

// ServiceExtProc is the ext_proc service's name, also a health service.
var ServiceExtProc = extprocv3.ExternalProcessor_ServiceDesc.ServiceName

// Deps are the endpoint picker's collaborators.
type Deps struct {
	// Picker decides (required): the request service.
	Picker Picker
	// Nodes lists the nodes (required), to map endpoints (ip:port) to node ids for the subset
	// hint and the served endpoint: the same source the picker reads.
	Nodes requests.NodeSource
	// Registry receives the metrics (optional).
	Registry prometheus.Registerer
	// Logger receives one line per routed request at debug level and stream errors (optional).
	Logger *slog.Logger
}

// Server is the ext_proc endpoint picker. Build it with New, Register it on a gRPC server built
// with GRPCOptions, and SetReady once the node view has synced.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer

	cfg     Config
	picker  Picker
	nodes   requests.NodeSource
	met     *metrics
	log     *slog.Logger
	health  *health.Server
	tracer  trace.Tracer
	tracing bool // cfg.TracerProvider records (trace.go)
	// flowHeaders: the picker runs flow control (requests.Service.FlowControl), so the request
	// headers it reads for class and tenant are passed to it.
	flowHeaders bool

	streams  atomic.Int64       // streams open now
	buffered *bytebudget.Budget // request body bytes held across streams, within MaxBufferedBytes
	readers  *readers           // the goroutines that read streams (readers.go)

	// observeAnswer, when set (by this package's benchmark, before serving), hears each
	// request's answer_seconds: the picker's own share of the added latency.
	observeAnswer func(time.Duration)
}

var _ extprocv3.ExternalProcessorServer = (*Server)(nil)

// New builds an endpoint picker; it starts nothing. Health is SERVING for liveness and
// NOT_SERVING for readiness and ext_proc until SetReady(true).
func New(cfg Config, deps Deps) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.Picker == nil || deps.Nodes == nil {
		return nil, fmt.Errorf("%w: the endpoint picker needs a picker and a node source", ErrConfig)
	}
	met, err := newMetrics(deps.Registry)
	if err != nil {
		return nil, fmt.Errorf("extproc: register metrics: %w", err)
	}
	log := deps.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, picker: deps.Picker, nodes: deps.Nodes, met: met, log: log, health: health.NewServer(),
		readers: newReaders(), buffered: bytebudget.New(cfg.MaxBufferedBytes), tracer: spans.Tracer(cfg.TracerProvider, tracerName), tracing: spans.Enabled(cfg.TracerProvider)}
	if f, ok := deps.Picker.(interface{ FlowControl() bool }); ok {
		s.flowHeaders = f.FlowControl()
	}
	s.health.SetServingStatus(ServiceLiveness, healthpb.HealthCheckResponse_SERVING)
	s.SetReady(false)
	return s, nil
}

// GRPCOptions are the server options the endpoint picker needs: a BUFFERED body comes as one
// message, larger than gRPC's default 4 MiB limit; messages are encoded, decoded and read into
// buffers that are not cleared before use (codec.go).
func (s *Server) GRPCOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(s.cfg.MaxRecvMsgBytes()),
		grpc.ForceServerCodecV2(wireCodec{}),
		experimental.BufferPool(dirtyPool),
	}
}

// Register adds the ext_proc service and grpc.health.v1 to g.
func (s *Server) Register(g *grpc.Server) {
	extprocv3.RegisterExternalProcessorServer(g, s)
	healthpb.RegisterHealthServer(g, s.health)
}

// SetReady sets readiness, the ext_proc service's health and the server's overall health ("").
func (s *Server) SetReady(ready bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ready {
		st = healthpb.HealthCheckResponse_SERVING
	}
	for _, svc := range []string{"", ServiceReadiness, ServiceExtProc} {
		s.health.SetServingStatus(svc, st)
	}
}

// Shutdown sets every health service NOT_SERVING and ends health watches.
func (s *Server) Shutdown() { s.health.Shutdown() }

// Streams returns the streams open now.
func (s *Server) Streams() int { return int(s.streams.Load()) }

// BufferedBytes returns the request body bytes held across streams now.
func (s *Server) BufferedBytes() int64 { return s.buffered.Held() }

// Process serves one ext_proc stream: one HTTP request and its response.
func (s *Server) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	n := s.streams.Add(1)
	s.met.streams.Inc()
	defer func() { s.streams.Add(-1); s.met.streams.Dec() }()
	ctx, cancel := context.WithTimeout(srv.Context(), s.cfg.MaxStreamDuration)
	defer cancel()

	st := &stream{s: s, ctx: ctx, send: srv.Send, reqMode: s.cfg.DefaultRequestBodyMode, respMode: s.cfg.DefaultResponseBodyMode,
		overCap: n > int64(s.cfg.MaxStreams)}
	// The reader (on a goroutine of s.readers) receives and handles every message itself, with
	// no hand-off per message; this goroutine only watches the deadlines, since Recv has none of
	// its own. st.mu serialises the two: the reader handles a message under it, and a deadline
	// takes it to answer and end the stream. The reader ends when the stream does: gRPC cancels
	// the stream as Process returns, and its Recv then fails.
	result := make(chan error, 1)
	s.readers.run(func() { result <- st.serve(srv) })
	reqTimer := time.NewTimer(s.cfg.RequestTimeout)
	defer reqTimer.Stop()
	reqDeadline := reqTimer.C
	for {
		select {
		case err := <-result:
			return err
		case <-ctx.Done():
			st.mu.Lock()
			defer st.mu.Unlock()
			if st.stopped {
				return nil
			}
			st.stopped = true
			defer st.close()
			if errors.Is(ctx.Err(), context.DeadlineExceeded) && srv.Context().Err() == nil {
				s.met.streamErrors.WithLabelValues("stream_timeout").Inc()
				st.abort(errStreamTimeout)
				return status.Errorf(codes.DeadlineExceeded, "extproc: the stream outlived its limit of %v", s.cfg.MaxStreamDuration)
			}
			s.met.streamErrors.WithLabelValues("cancelled").Inc()
			st.abort(errCancelled)
			return nil
		case <-reqDeadline:
			reqDeadline = nil
			st.mu.Lock()
			if st.requestDone || st.stopped {
				st.mu.Unlock()
				continue
			}
			st.stopped = true
			s.met.streamErrors.WithLabelValues("request_timeout").Inc()
			st.abort(errRequestTimeout)
			_ = srv.Send(immediate(408, "request_timeout", fmt.Sprintf("the request body did not arrive within %v", s.cfg.RequestTimeout)))
			st.close()
			st.mu.Unlock()
			return nil
		}
	}
}

// serve is the stream's reader: it receives each message and handles it under st.mu until the
// stream ends, an answer ends it, or a deadline stopped it.
func (st *stream) serve(srv extprocv3.ExternalProcessor_ProcessServer) error {
	s := st.s
	for {
		req, err := srv.Recv()
		st.mu.Lock()
		if st.stopped {
			st.mu.Unlock()
			return nil
		}
		done := true
		switch {
		case errors.Is(err, io.EOF):
			st.closed()
			err = nil
		case err != nil:
			if c := status.Code(err); c == codes.Canceled || c == codes.DeadlineExceeded {
				s.met.streamErrors.WithLabelValues("cancelled").Inc()
				st.abort(errCancelled)
				err = nil
			} else {
				s.met.streamErrors.WithLabelValues("recv").Inc()
				st.abort(err)
			}
		default:
			if done, err = st.handle(req); err != nil {
				s.met.streamErrors.WithLabelValues("send").Inc()
				st.abort(err)
				done = true
			}
		}
		if done {
			st.stopped = true
			st.close()
		}
		st.mu.Unlock()
		if done {
			return err
		}
	}
}

// Why a routed request ended without its response (Outcome.Err).
var (
	errStreamClosed   = errors.New("extproc: the gateway closed the stream before the response ended")
	errCancelled      = errors.New("extproc: the gateway cancelled the stream")
	errStreamTimeout  = errors.New("extproc: the stream outlived its limit")
	errRequestTimeout = errors.New("extproc: the request body did not arrive in time")
)
