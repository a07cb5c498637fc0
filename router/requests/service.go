package requests

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/prefixmesh/prefixmesh/internal/bytebudget"
	"github.com/prefixmesh/prefixmesh/internal/tokenizer"
	"github.com/prefixmesh/prefixmesh/internal/tracing/spans"
	"github.com/prefixmesh/prefixmesh/router/flow"
)

// DefaultMaxBodyBufferBytes is Config.MaxBodyBufferBytes' default, 512 MiB (the endpoint
// picker's own body budget too): a small share of a router's memory (its index is bounded near
// 256 MiB), yet 8,192 uploads a chunk into their bodies, twice the default in-flight bound, or
// 64 bodies at the front door's 8 MiB cap. Without a budget 128 connections that each sent one
// byte of a declared 8 MiB body held 1 GiB, and --max-inflight's 4,096 would hold 32 GiB.
const DefaultMaxBodyBufferBytes = 512 << 20

// Config.Tokenizer values besides the embedded vocabularies.
const (
	// TokenizerEngine asks a healthy node's engine (POST /tokenize).
	TokenizerEngine = "engine"
	// TokenizerNone accepts only token-id prompts; text and chat prompts are refused (400).
	TokenizerNone = "none"
)

// Config configures the request service. cmd/router maps its flags to it one to one.
type Config struct {
	// Tokenizer tokenises text prompts: an embedded vocabulary of internal/tokenizer
	// (cl100k_base, the simulated engine's default), TokenizerEngine to ask a healthy node's
	// engine, for models whose vocabulary the router does not embed, or TokenizerNone.
	Tokenizer string
	// MaxInFlight bounds the requests the front door proxies at once; one more is refused at
	// once (429; no queue: a queue in front of queues only adds latency). 4096 streams of a few
	// KB of buffers each is well within one router's memory and above what 64 nodes × 64
	// sequences can serve.
	MaxInFlight int
	// MaxBodyBufferBytes caps the request body bytes the front door holds across all requests
	// at once, from the first chunk read until the request no longer needs its body (it is kept
	// to replay on a retry, so routing does not free it); a body that would go over is refused
	// (429). Buffers grow as bytes arrive, a chunk ahead at most, so a client pays for what it
	// holds by sending it. Default DefaultMaxBodyBufferBytes. The front door asks for at least
	// twice its body cap: one body at the cap is held twice while its chunks are joined.
	MaxBodyBufferBytes int64
	// ConnectTimeout bounds dialling an engine: 2 s; loopback or in-cluster connects take
	// microseconds, and a connect error is retried on another node, so waiting long only delays
	// the retry.
	ConnectTimeout time.Duration
	// UpstreamTLS, when set, is used for https:// engine URLs (client certificates for mTLS
	// toward the nodes).
	UpstreamTLS *tls.Config
	// MaxIdleConnsPerHost keeps this many idle connections to each engine: 256, so a burst of
	// concurrent requests to one node reuses connections instead of dialling (Go's default of
	// 2 would reopen connections under any concurrency).
	MaxIdleConnsPerHost int
	// TracerProvider, when set and not the no-op provider (internal/tracing), traces the
	// service's steps of each request under the door's span: tokenize and decide. nil
	// (default): no span work at all.
	TracerProvider trace.TracerProvider
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{
		Tokenizer:           tokenizer.CL100kBase,
		MaxInFlight:         4096,
		MaxBodyBufferBytes:  DefaultMaxBodyBufferBytes,
		ConnectTimeout:      2 * time.Second,
		MaxIdleConnsPerHost: 256,
	}
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	switch {
	case c.MaxInFlight <= 0:
		return fmt.Errorf("%w: MaxInFlight %d must be positive", ErrConfig, c.MaxInFlight)
	case c.MaxBodyBufferBytes <= 0:
		return fmt.Errorf("%w: MaxBodyBufferBytes %d must be positive", ErrConfig, c.MaxBodyBufferBytes)
	case c.ConnectTimeout <= 0:
		return fmt.Errorf("%w: ConnectTimeout %v must be positive", ErrConfig, c.ConnectTimeout)
	case c.MaxIdleConnsPerHost < 0:
		return fmt.Errorf("%w: MaxIdleConnsPerHost %d must not be negative", ErrConfig, c.MaxIdleConnsPerHost)
	}
	if c.Tokenizer != TokenizerEngine && c.Tokenizer != TokenizerNone {
		if _, err := tokenizer.New(c.Tokenizer); err != nil {
			return fmt.Errorf("%w: Tokenizer: %w", ErrConfig, err)
		}
	}
	return nil
}

// Deps are the request service's collaborators.
type Deps struct {
	// Picker chooses nodes (required).
	Picker Picker
	// Health receives every attempt's outcome (optional; Health implements it).
	Health HealthReporter
	// Nodes lists the nodes; required when Config.Tokenizer is TokenizerEngine.
	Nodes NodeSource
	// Ejector keeps the engine tokenizer away from ejected nodes (optional).
	Ejector Ejector
	// Flow, when set, is flow control (router/flow): every request a door routes through the
	// service is admitted by it once its model is known and before it is tokenised and decided.
	// nil: no flow control.
	Flow flow.Admitter
	// Registry, when set, receives the service's metrics.
	Registry prometheus.Registerer
}

// Service is the request service the doors share. Build it with New; it starts nothing (Stack
// runs the loops of its picker and health). Safe for concurrent use.
type Service struct {
	cfg     Config
	picker  Picker
	health  HealthReporter
	nodes   NodeSource // may be nil
	ejector Ejector    // may be nil
	flow    flow.Admitter
	tok     promptTokenizer
	client  *http.Client
	adm     admission
	bodies  *bytebudget.Budget // request body bytes held, within MaxBodyBufferBytes
	tracer  trace.Tracer
	tracing bool // cfg.TracerProvider records: spans are made (trace.go)
}

// New builds a request service; it starts nothing.
func New(cfg Config, deps Deps) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.Picker == nil {
		return nil, fmt.Errorf("%w: nil Picker", ErrConfig)
	}
	s := &Service{cfg: cfg, picker: deps.Picker, health: deps.Health, nodes: deps.Nodes, ejector: deps.Ejector, flow: deps.Flow,
		adm: admission{max: cfg.MaxInFlight}, bodies: bytebudget.New(cfg.MaxBodyBufferBytes)}
	s.tracer, s.tracing = spans.Tracer(cfg.TracerProvider, tracerName), spans.Enabled(cfg.TracerProvider)
	if s.health == nil {
		s.health = nopHealth{}
	}
	s.client = &http.Client{Transport: newTransport(&cfg)}
	inexact := newInexactCounter()
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
		s.tok = embeddedTokenizer{tok: t, inexact: inexact}
	}
	if deps.Registry != nil {
		if err := deps.Registry.Register(inexact); err != nil {
			return nil, fmt.Errorf("requests: register metrics: %w", err)
		}
	}
	return s, nil
}

// Pick asks the picker for a node for req, never one in exclude (the nodes the request already
// tried), under a decide span that records the decision; attempt numbers a door's tries of one
// request (1, 2, …; 0 for a door that tries once). The errors are the Picker's. The caller must
// call the returned Pick's Done exactly once.
func (s *Service) Pick(ctx context.Context, req *PickRequest, exclude []string, attempt int) (Pick, error) {
	dctx, span := s.decideSpan(ctx)
	pk, err := s.picker.Pick(dctx, req, exclude)
	if err != nil {
		decideFailed(span, err)
		return Pick{}, err
	}
	prompt := -1
	if req.Tokens != nil {
		prompt = len(req.Tokens)
	}
	decided(span, &pk, prompt, attempt)
	return pk, nil
}

type nopHealth struct{}

func (nopHealth) ReportFailure(string) {}
func (nopHealth) ReportSuccess(string) {}

// Models returns the union of the models the nodes serve, sorted (Picker.Models).
func (s *Service) Models() []string { return s.picker.Models() }

// Health is where a door reports each attempt's outcome (passive health).
func (s *Service) Health() HealthReporter { return s.health }

// Nodes is the node list the service reads, nil when it was given none.
func (s *Service) Nodes() NodeSource { return s.nodes }

// Ejected reports whether passive health has taken node out of routing (false without an
// Ejector).
func (s *Service) Ejected(node string) bool { return s.ejector != nil && s.ejector.Ejected(node) }

// Client is the pooled client toward the engines (Config's connect timeout, upstream TLS and
// idle connections): the engine tokenizer's, and the front door's proxy and pass-throughs.
func (s *Service) Client() *http.Client { return s.client }

// Bodies is the budget of request body bytes held across requests (Config.MaxBodyBufferBytes).
func (s *Service) Bodies() *bytebudget.Budget { return s.bodies }
