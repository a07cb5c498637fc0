package routerd

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/prefixmesh/prefixmesh/internal/ratelog"
	"github.com/prefixmesh/prefixmesh/router"
	"github.com/prefixmesh/prefixmesh/router/directory"
	"github.com/prefixmesh/prefixmesh/router/flow"
	"github.com/prefixmesh/prefixmesh/router/frontdoor"
	"github.com/prefixmesh/prefixmesh/router/requests"
	"github.com/prefixmesh/prefixmesh/routing"
)

// HTTP server timeouts. No WriteTimeout: completions stream for as long as decoding takes.
const (
	readHeaderTimeout = 10 * time.Second // a slow-loris client cannot hold a connection forever
	idleTimeout       = 2 * time.Minute  // clients' keep-alive connections are reused, then reaped
)

// frontDoor is the request service over the gossip mirror (requests.Stack), its picker wrapped
// in router.PinnedPicker so that placement pins hold, and the OpenAI-compatible HTTP front door
// over it (Server); the endpoint picker is built over the same Service.
type frontDoor struct {
	*requests.Stack
	Server *frontdoor.Server
	flow   *flow.Controller // nil without --flow-control
	// Directory answers KV-location queries from the index: on the front door (POST /query,
	// /query_by_hash) and as the gRPC Directory service.
	Directory *directory.Directory
}

func newFrontDoor(cfg ServeConfig, t tlsSetup, mirror requests.NodeStatusSource, idx *routing.Index, dec *routing.Decider, table router.PinTable,
	fc *flow.Controller, tp trace.TracerProvider, reg *prometheus.Registry, logger *slog.Logger) (*frontDoor, error) {
	nodes := requests.MirrorNodes{M: mirror}
	sc := requests.DefaultStackConfig()
	sc.Service.Tokenizer = cfg.Tokenizer
	sc.Service.MaxInFlight = cfg.MaxInFlight
	sc.Service.MaxBodyBufferBytes = cfg.MaxBodyBufferBytes
	sc.Service.UpstreamTLS = t.upstream
	sc.Service.TracerProvider = tp
	sc.Policy = cfg.Policy
	sc.PolicyConfig = cfg.policyConfig()
	sc.Decider = dec
	sc.Picker.Disaggregate, _ = routing.ParseDisaggMode(cfg.Disaggregate) // validated
	sc.WrapPicker = func(p requests.Picker) requests.Picker {
		return router.PinnedPicker{Picker: p, Nodes: nodes, Pins: table}
	}
	if fc != nil { // never a nil *Controller in the interface: the doors test it against nil
		sc.Flow = fc
	}
	st, err := requests.NewStack(sc, nodes, idx, reg)
	if err != nil {
		return nil, err
	}
	fcfg := frontdoor.DefaultConfig()
	fcfg.BodyTimeout = cfg.BodyTimeout
	fcfg.FirstByteFloor, fcfg.FirstByteCeiling = cfg.FirstByteFloor, cfg.FirstByteCeiling
	fcfg.StreamIdleTimeout = cfg.StreamIdleTimeout
	if cfg.CORSOrigins != "" {
		for _, o := range strings.Split(cfg.CORSOrigins, ",") {
			if o = strings.TrimSpace(o); o != "" {
				fcfg.CORSOrigins = append(fcfg.CORSOrigins, o)
			}
		}
	}
	fcfg.TLS = t.http
	fcfg.TracerProvider = tp
	dir := directory.New(idx, func(dst []directory.Node) []directory.Node {
		for _, n := range nodes.Nodes() {
			dst = append(dst, directory.Node{ID: n.Info.ID, Model: n.Info.Model, BlockSize: n.Info.BlockSize})
		}
		return dst
	})
	srv, err := frontdoor.New(fcfg, frontdoor.Deps{Service: st.Service, Registry: reg, Logger: logger, Directory: dir.Handler()})
	if err != nil {
		return nil, err
	}
	st.Health.OnEject(srv.ObserveEjection)
	st.Health.OnSweep(srv.ForgetDeparted)
	return &frontDoor{Stack: st, Server: srv, flow: fc, Directory: dir}, nil
}

// start runs the probes, the overlay expiry and flow control's loop until shutdown.
func (f *frontDoor) start(ctx context.Context) {
	f.Start(ctx)
	if f.flow != nil {
		f.flow.Start(ctx) // ends with ctx, after the doors have drained
	}
}

// Shutdown drains the front door within ctx, then stops the service's loops.
func (f *frontDoor) Shutdown(ctx context.Context) error {
	err := f.Server.Shutdown(ctx)
	f.Close()
	return err
}

// httpServer serves the router's HTTP listener: /healthz and vLLM's /health (SERVING once the
// mirror has synced, 503 while draining or while notServing names a reason, such as isolated
// gossip) and, unless --metrics-listen moves it, /metrics are the router's; every other path is
// the front door's. warning, when set, is appended to a healthy answer (plaintext gRPC).
func httpServer(ctx context.Context, fd *frontDoor, reg *prometheus.Registry, withMetrics bool, ready *atomic.Bool, notServing func() string, warning string, logger *slog.Logger) *http.Server {
	mux := http.NewServeMux()
	if withMetrics {
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	} else { // moved to --metrics-listen: not served beside the front door either
		mux.HandleFunc("GET /metrics", http.NotFound)
	}
	mux.HandleFunc("GET /healthz", healthHandler("ok\n", warning, ready, notServing))
	mux.HandleFunc("GET /health", healthHandler("", "", ready, notServing)) // vLLM's: 200 with an empty body when healthy
	mux.Handle("/", fd.Server.Handler())
	// Failed TLS handshakes and bad requests are counted and logged a few per interval.
	errLog, err := ratelog.ErrorLog(logger, reg)
	if err != nil { // only a second registration on reg, which Run never does
		logger.Error("http error log metrics", "err", err)
		errLog = slog.NewLogLogger(logger.Handler(), slog.LevelWarn)
	}
	return &http.Server{
		Handler:           mux,
		TLSConfig:         fd.Server.TLSConfig(),
		ReadHeaderTimeout: readHeaderTimeout,
		IdleTimeout:       idleTimeout,
		// Requests outlive ctx's cancellation (SIGTERM): the drain decides when they end.
		BaseContext: func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
		ErrorLog:    errLog,
	}
}

// healthHandler answers okBody (and the warning on a line of its own, when both are set) while
// ready and no reason makes the router not serving, else 503 with why.
func healthHandler(okBody, warning string, ready *atomic.Bool, notServing func() string) http.HandlerFunc {
	if warning != "" && okBody != "" {
		okBody += "warning: " + warning + "\n"
	}
	return func(w http.ResponseWriter, _ *http.Request) {
		if reason := notServing(); reason != "" {
			http.Error(w, "not serving: "+reason, http.StatusServiceUnavailable)
			return
		}
		if !ready.Load() {
			http.Error(w, "not serving: mirror not synced, or draining", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, okBody)
	}
}

// metricsServer serves /metrics alone, for --metrics-listen: HTTPS when tc is set
// (--metrics-tls-*), else plaintext, which the listener rule allows only on loopback or with
// --insecure-metrics.
func metricsServer(reg *prometheus.Registry, tc *tls.Config) *http.Server {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	return &http.Server{Handler: mux, TLSConfig: tc, ReadHeaderTimeout: readHeaderTimeout, IdleTimeout: idleTimeout}
}
