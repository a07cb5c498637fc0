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

	"github.com/prefixmesh/prefixmesh/internal/bytebudget"
	"github.com/prefixmesh/prefixmesh/internal/httpstatus"
	"github.com/prefixmesh/prefixmesh/internal/ratelog"
	"github.com/prefixmesh/prefixmesh/internal/tokenizer"
	"github.com/prefixmesh/prefixmesh/internal/tracing/spans"
	"github.com/prefixmesh/prefixmesh/router/flow"
)

// Deps are the front door's collaborators.
type Deps struct {
	// Picker chooses nodes (required).
	Picker Picker
	// Health receives every attempt's outcome (optional; Health implements it).
	Health HealthReporter
	// Nodes lists the nodes; required when Config.Tokenizer is TokenizerEngine.
	Nodes NodeSource
	// Ejector keeps the engine tokenizer away from ejected nodes (optional).
	Ejector Ejector
	// Registry, when set, receives the metrics and is served on GET /metrics.
	Registry *prometheus.Registry
	// Logger receives one line per request (nil: discarded).
	Logger *slog.Logger
	// Flow, when set, is flow control (router/flow): every routed request, through the front
	// door or the gateway's endpoint picker, is admitted by it once its model is known and
	// before it is tokenised and decided. nil: no flow control.
	Flow flow.Admitter
}

// Server is the HTTP front door. Build it with New; serve Handler yourself or call Start, and
// Shutdown to drain.
type Server struct {
	cfg     Config
	picker  Picker
	health  HealthReporter
	tok     promptTokenizer
	nodes   NodeSource // for /tokenize and /detokenize; may be nil
	ejector Ejector    // may be nil
	client  *http.Client
	met     *metrics
	reg     *prometheus.Registry
	log     *slog.Logger
	tracer  trace.Tracer
	tracing bool          // cfg.TracerProvider records: spans are made (trace.go)
	flow    flow.Admitter // nil: off
	created int64
	adm     admission
	bodies  *bytebudget.Budget // request body bytes held, within MaxBodyBufferBytes (body.go)
	handler http.Handler
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
	if deps.Picker == nil {
		return nil, fmt.Errorf("%w: nil Picker", ErrConfig)
	}
	s := &Server{cfg: cfg, picker: deps.Picker, health: deps.Health, nodes: deps.Nodes, ejector: deps.Ejector, reg: deps.Registry, log: deps.Logger, flow: deps.Flow,
		created: time.Now().Unix(), adm: admission{max: cfg.MaxInFlight}, bodies: bytebudget.New(cfg.MaxBodyBufferBytes)}
	s.stop, s.stopCancel = context.WithCancel(context.Background())
	s.tracer, s.tracing = spans.Tracer(cfg.TracerProvider, tracerName), spans.Enabled(cfg.TracerProvider)
	if s.health == nil {
		s.health = nopHealth{}
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.client = &http.Client{Transport: newTransport(&cfg)}
	switch cfg.Tokenizer {
	case TokenizerNone:
		s.tok = idsOnly{}
	case TokenizerEngine:
		if deps.Nodes == nil {
			return nil, fmt.Errorf("%w: tokenizer %q needs Deps.Nodes", ErrConfig, TokenizerEngine)
		}
		s.tok = &engineTokenizer{src: deps.Nodes, ejector: deps.Ejector, client: s.client}
	default:
		t, err := tokenizer.New(cfg.Tokenizer)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrConfig, err)
		}
		s.tok = embeddedTokenizer{tok: t}
	}
	var reg prometheus.Registerer
	if deps.Registry != nil {
		reg = deps.Registry
	}
	var err error
	if s.met, err = newMetrics(reg, s.bodies); err != nil {
		return nil, fmt.Errorf("frontdoor: register metrics: %w", err)
	}
	if et, ok := s.tok.(embeddedTokenizer); ok {
		et.inexact = s.met.inexact
		s.tok = et
	}
	s.handler = s.routes()
	return s, nil
}

// newTransport is the pooled client toward engines. Compression is off so bytes pass through
// unchanged, and environment proxies are ignored: engines are in-cluster addresses.
func newTransport(cfg *Config) *http.Transport {
	d := &net.Dialer{Timeout: cfg.ConnectTimeout, KeepAlive: 30 * time.Second}
	return &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return copyConn{c}, nil
		},
		MaxIdleConnsPerHost: cfg.MaxIdleConnsPerHost,
		IdleConnTimeout:     90 * time.Second,
		TLSClientConfig:     cfg.UpstreamTLS,
		TLSHandshakeTimeout: cfg.ConnectTimeout,
		ForceAttemptHTTP2:   cfg.UpstreamTLS != nil,
		DisableCompression:  true,
	}
}

type nopHealth struct{}

func (nopHealth) ReportFailure(string) {}
func (nopHealth) ReportSuccess(string) {}

// Handler returns the front door's routes:
//
//	POST /v1/completions, POST /v1/chat/completions   routed and proxied (batches split per prompt)
//	GET  /v1/models, GET /v1/models/{id}              the union of the nodes' models
//	POST /tokenize, POST /detokenize                  passed through to a node's engine (vLLM's)
//	GET  /health, GET /version                        vLLM's: 200 (503 draining), the version
//	GET  /healthz                                     200, or 503 while draining
//	GET  /metrics                                     when Deps.Registry is set
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
	for _, m := range s.picker.Models() {
		list.Data = append(list.Data, modelJSON{ID: m, Object: "model", Created: s.created, OwnedBy: "prefixmesh"})
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(list)
}

func (s *Server) serveHealthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	if s.adm.isDraining() {
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

// Shutdown drains: from now on new requests get 503 with Connection: close; it waits until the
// requests in flight have finished or ctx ends, then stops the listener started by Start (if
// any) and closes idle upstream connections. It returns ctx's error if the deadline cut the drain
// short (the remaining connections are closed, which cancels their upstream requests).
func (s *Server) Shutdown(ctx context.Context) error {
	idle := s.adm.drain()
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

// admission is the router's own in-flight bound: a counter, not a queue, so a request over the
// cap is refused at once (429) and a draining server refuses everything new (503).
type admission struct {
	mu       sync.Mutex // guards everything below
	n, max   int
	draining bool
	idle     chan struct{} // closed when draining and n reaches 0
}

func (a *admission) enter() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case a.draining:
		return ErrDraining
	case a.n >= a.max:
		return ErrOverloaded
	}
	a.n++
	return nil
}

func (a *admission) leave() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.n--
	if a.n == 0 && a.idle != nil {
		close(a.idle)
		a.idle = nil
	}
}

func (a *admission) drain() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.draining = true
	ch := make(chan struct{})
	if a.n == 0 {
		close(ch)
	} else if a.idle != nil {
		ch = a.idle
	} else {
		a.idle = ch
	}
	return ch
}

func (a *admission) isDraining() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.draining
}

// TLSConfig returns Config.TLS, for callers that serve Handler on their own http.Server.
func (s *Server) TLSConfig() *tls.Config { return s.cfg.TLS }

// InFlight returns the requests being proxied now.
func (s *Server) InFlight() int {
	s.adm.mu.Lock()
	defer s.adm.mu.Unlock()
	return s.adm.n
}
