package frontdoor

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/prefixmesh/prefixmesh/internal/httpstatus"
	"github.com/prefixmesh/prefixmesh/internal/ratelog"
	"github.com/prefixmesh/prefixmesh/internal/tracing/spans"
	"github.com/prefixmesh/prefixmesh/router/requests"
)

// Deps are the front door's collaborators.
type Deps struct {
	// Service is the request service the front door serves through (required): admission, the
	// body budget, flow control, tokenising, the pick and passive health.
	Service *requests.Service
	// Registry, when set, receives the metrics and is served on GET /metrics.
	Registry *prometheus.Registry
	// Logger receives one line per request (nil: discarded).
	Logger *slog.Logger
	// Directory, when set, serves the KV directory's POST /query and /query_by_hash
	// (router/directory) on this door, under its admission bound.
	Directory http.Handler
}

// Server is the HTTP front door. Build it with New; serve Handler yourself or call Start, and
// Shutdown to drain.
type Server struct {
	cfg     Config
	svc     *requests.Service
	client  *http.Client // the service's, toward the engines
	met     *metrics
	reg     *prometheus.Registry
	log     *slog.Logger
	tracer  trace.Tracer
	tracing bool // cfg.TracerProvider records: spans are made (trace.go)
	created int64
	handler http.Handler
	// directory serves the KV directory's endpoints (Deps.Directory), nil when not mounted.
	directory http.Handler
	// stop ends every attempt in flight when Shutdown's deadline passes, so streams end with
	// an SSE error event instead of a bare EOF.
	stop       context.Context
	stopCancel context.CancelFunc

	mu      sync.Mutex // guards httpSrv
	httpSrv *http.Server
	serveWG sync.WaitGroup
}

// New builds a front door; it starts nothing.
func New(cfg Config, deps Deps) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.Service == nil {
		return nil, fmt.Errorf("%w: nil Service", ErrConfig)
	}
	if limit := deps.Service.Bodies().Limit(); limit < 2*cfg.MaxBodyBytes {
		return nil, fmt.Errorf("%w: the service's body budget of %d bytes must hold twice MaxBodyBytes %d (one body at the cap, while it is joined)", ErrConfig, limit, cfg.MaxBodyBytes)
	}
	s := &Server{cfg: cfg, svc: deps.Service, client: deps.Service.Client(), reg: deps.Registry, log: deps.Logger, created: time.Now().Unix(),
		directory: deps.Directory}
	s.stop, s.stopCancel = context.WithCancel(context.Background())
	s.tracer, s.tracing = spans.Tracer(cfg.TracerProvider, tracerName), spans.Enabled(cfg.TracerProvider)
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	var reg prometheus.Registerer
	if deps.Registry != nil {
		reg = deps.Registry
	}
	var err error
	if s.met, err = newMetrics(reg, s.svc.Bodies()); err != nil {
		return nil, fmt.Errorf("frontdoor: register metrics: %w", err)
	}
	s.handler = s.routes()
	return s, nil
}

// Handler returns the front door's routes:
//
//	POST /v1/completions, POST /v1/chat/completions   routed and proxied (batches split per prompt)
//	GET  /v1/models, GET /v1/models/{id}              the union of the nodes' models
//	POST /tokenize, POST /detokenize                  passed through to a node's engine (vLLM's)
//	GET  /health, GET /version                        vLLM's: 200 (503 draining), the version
//	GET  /healthz                                     200, or 503 while draining
//	GET  /metrics                                     when Deps.Registry is set
//	POST /query, POST /query_by_hash                  the KV directory, when Deps.Directory is set
func (s *Server) Handler() http.Handler { return s.handler }

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST /v1/completions", s.instrument("completions", s.serveGenerate(false, "/v1/completions")))
	mux.Handle("POST /v1/chat/completions", s.instrument("chat_completions", s.serveGenerate(true, "/v1/chat/completions")))
	mux.Handle("GET /v1/models", s.instrument("models", http.HandlerFunc(s.serveModels)))
	mux.Handle("GET /v1/models/{id}", s.instrument("models", http.HandlerFunc(s.serveModel)))
	mux.Handle("GET /healthz", s.instrument("healthz", http.HandlerFunc(s.serveHealthz)))
	mux.Handle("GET /health", s.instrument("health", http.HandlerFunc(s.serveHealth)))
	mux.Handle("GET /version", s.instrument("version", http.HandlerFunc(s.serveVersion)))
	mux.Handle("POST /tokenize", s.instrument("tokenize", http.HandlerFunc(s.servePassthrough)))
	mux.Handle("POST /detokenize", s.instrument("detokenize", http.HandlerFunc(s.servePassthrough)))
	allowed := map[string]string{"/v1/completions": "POST", "/v1/chat/completions": "POST", "/v1/models": "GET", "/healthz": "GET",
		"/health": "GET", "/version": "GET", "/tokenize": "POST", "/detokenize": "POST"}
	if s.reg != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{Registry: s.reg}))
		allowed["/metrics"] = "GET"
	}
	if s.directory != nil {
		for _, path := range []string{"/query", "/query_by_hash"} {
			mux.Handle("POST "+path, s.instrument("directory", s.admitted(s.directory)))
			allowed[path] = "POST"
		}
	}
	for path, method := range allowed {
		mux.Handle(path, s.instrument("other", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", method)
			writeError(w, http.StatusMethodNotAllowed, codeMethod, fmt.Sprintf("%s %s: use %s", r.Method, path, method))
		})))
	}
	mux.Handle("/", s.instrument("other", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, codeNotFound, fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path))
	})))
	return s.withCORS(noRedirects(mux))
}

// admitted serves h under the door's in-flight bound: 429 with Retry-After at the bound, 503
// while draining, as a generation request is answered.
func (s *Server) admitted(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := s.svc.Enter(); err != nil {
			s.refuseAdmission(w, err)
			return
		}
		defer s.svc.Leave()
		h.ServeHTTP(w, r)
	})
}

// refuseAdmission answers a request the in-flight bound refused (err from Service.Enter): 503
// with Connection: close while draining, else 429 with Retry-After.
func (s *Server) refuseAdmission(w http.ResponseWriter, err error) {
	if errors.Is(err, requests.ErrDraining) {
		s.met.rejected.WithLabelValues("draining").Inc()
		w.Header().Set("Connection", "close")
		writeError(w, http.StatusServiceUnavailable, codeDraining, "the router is shutting down; retry on another replica")
		return
	}
	s.met.rejected.WithLabelValues("overloaded").Inc()
	w.Header().Set("Retry-After", retryAfterSeconds)
	writeError(w, http.StatusTooManyRequests, codeOverloaded,
		fmt.Sprintf("the router has %d requests in flight, its limit; retry later", s.svc.MaxInFlight()))
}

func (s *Server) instrument(endpoint string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := httpstatus.Wrap(w)
		start := time.Now()
		defer func() {
			outcome := sw.Broken()
			if outcome == "" {
				outcome = outcomeComplete
			}
			s.met.requests.WithLabelValues(endpoint, strconv.Itoa(sw.Status()), outcome).Inc()
			s.met.latency.WithLabelValues(endpoint).Observe(time.Since(start).Seconds())
		}()
		h.ServeHTTP(sw, r)
	})
}

func (s *Server) serveModels(w http.ResponseWriter, _ *http.Request) {
	list := struct {
		Object string      `json:"object"`
		Data   []modelJSON `json:"data"`
	}{Object: "list", Data: []modelJSON{}}
	for _, m := range s.svc.Models() {
		list.Data = append(list.Data, modelJSON{ID: m, Object: "model", Created: s.created, OwnedBy: "prefixmesh"})
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(list)
}

func (s *Server) serveHealthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	if s.svc.Draining() {
		w.Header().Set("Connection", "close")
		w.Header().Set("Retry-After", retryAfterSeconds)
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, `{"status":"draining"}`+"\n")
		return
	}
	_, _ = io.WriteString(w, `{"status":"ok"}`+"\n")
}

// Start serves the front door on ln (HTTPS when Config.TLS is set) until Shutdown. It does not
// block.
func (s *Server) Start(ctx context.Context, ln net.Listener) {
	// Lines about connections net/http could not serve are outsiders' doing: a few per interval
	// (the daemons serve this handler from their own server, which also counts them).
	errLog, _ := ratelog.ErrorLog(s.log, nil) // nil registry: nothing to register, no error
	srv := &http.Server{
		Handler: s.handler,
		// ReadHeaderTimeout bounds slow-loris clients; bodies are bounded by MaxBodyBytes and the
		// client's own pace, since a generation request may legitimately take minutes.
		ReadHeaderTimeout: 10 * time.Second,
		TLSConfig:         s.cfg.TLS,
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
		ErrorLog:          errLog,
	}
	s.mu.Lock()
	s.httpSrv = srv
	s.mu.Unlock()
	s.serveWG.Add(1)
	go func() {
		defer s.serveWG.Done()
		var err error
		if s.cfg.TLS != nil {
			err = srv.ServeTLS(ln, "", "")
		} else {
			err = srv.Serve(ln)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("front door serve", "err", err)
		}
	}()
}

// Shutdown drains: from now on new requests get 503 with Connection: close (the service admits
// nothing new, requests.Service.Drain); it waits until the requests in flight have finished or
// ctx ends, then stops the listener started by Start (if any) and closes idle upstream
// connections. It returns ctx's error if the deadline cut the drain short (the remaining
// connections are closed, which cancels their upstream requests).
func (s *Server) Shutdown(ctx context.Context) error {
	idle := s.svc.Drain()
	var err error
	select {
	case <-idle:
	case <-ctx.Done():
		err = ctx.Err()
		// Cut the streams still in flight: each ends with an SSE error event, written
		// before their connections close (bounded by drainEventGrace).
		s.stopCancel()
		grace := time.NewTimer(drainEventGrace)
		select {
		case <-idle:
		case <-grace.C:
		}
		grace.Stop()
	}
	defer s.stopCancel()
	s.mu.Lock()
	srv := s.httpSrv
	s.mu.Unlock()
	if srv != nil {
		if serr := srv.Shutdown(ctx); serr != nil {
			_ = srv.Close()
			if err == nil {
				err = serr
			}
		}
		s.serveWG.Wait()
	}
	s.client.CloseIdleConnections()
	return err
}

// drainEventGrace bounds how long Shutdown waits, once its deadline has passed, for the cut
// streams to write their error events: writing one event to a live connection takes
// microseconds, so 1 s only matters for clients that stopped reading.
const drainEventGrace = time.Second

// TLSConfig returns Config.TLS, for callers that serve Handler on their own http.Server.
func (s *Server) TLSConfig() *tls.Config { return s.cfg.TLS }

// InFlight returns the requests being proxied now (the service's in-flight slots).
func (s *Server) InFlight() int { return s.svc.InFlight() }
