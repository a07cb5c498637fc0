package frontdoor

import (
	"crypto/tls"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/prefixmesh/prefixmesh/internal/tokenizer"
)

// MaxBodyBytes caps a request body at 8 MiB: a 128k-token prompt as a JSON id array (~7 bytes per
// id) twice over, so whatever an engine accepts passes (the simulated engine accepts exactly this
// much), while one request can still not make the router buffer an unbounded body (the body is
// held in memory once, to be tokenised and replayed on a retry).
const MaxBodyBytes = 8 << 20

// DefaultMaxBodyBufferBytes is Config.MaxBodyBufferBytes' default, 512 MiB (the endpoint
// picker's body budget too): a small share of a router's memory (its index is bounded near
// 256 MiB), yet 8,192 uploads a chunk into their bodies, twice the default in-flight bound, or
// 64 bodies at the 8 MiB cap. Without a budget 128 connections that each sent one byte of a
// declared 8 MiB body held 1 GiB, and --max-inflight's 4,096 would hold 32 GiB.
const DefaultMaxBodyBufferBytes = 512 << 20

// maxErrorBodyBytes bounds how much of a failed (5xx) upstream response is kept to relay if the
// retry fails too: OpenAI-shaped errors are a few hundred bytes.
const maxErrorBodyBytes = 64 << 10

// maxUsageScanBytes bounds how much of a non-streaming response is kept to read its usage when
// the engine sent no X-Prefixmesh-Cached-Tokens header: 1 MiB holds any completion's JSON
// envelope; beyond that the response is relayed without measuring it.
const maxUsageScanBytes = 1 << 20

// Config.Tokenizer values besides the embedded vocabularies.
const (
	// TokenizerEngine asks a healthy node's engine (POST /tokenize).
	TokenizerEngine = "engine"
	// TokenizerNone accepts only token-id prompts; text and chat prompts are answered 400.
	TokenizerNone = "none"
)

// Config configures the front door. cmd/router maps its flags to it one to one.
type Config struct {
	// Tokenizer tokenises text prompts: an embedded vocabulary of internal/tokenizer
	// (cl100k_base, the simulated engine's default), TokenizerEngine to ask a healthy node's
	// engine, for models whose vocabulary the router does not embed, or TokenizerNone.
	Tokenizer string
	// MaxInFlight bounds the requests the front door proxies at once; one more is answered 429
	// at once (no queue: a queue in front of queues only adds latency). 4096 streams of a few
	// KB of buffers each is well within one router's memory and above what 64 nodes × 64
	// sequences can serve.
	MaxInFlight int
	// MaxBodyBytes caps request bodies; see the MaxBodyBytes constant.
	MaxBodyBytes int64
	// MaxBodyBufferBytes caps the request body bytes the front door holds across all requests
	// at once, from the first chunk read until the request no longer needs its body (it is kept
	// to replay on a retry, so routing does not free it); a body that would go over is answered
	// 429. Buffers grow as bytes arrive, a chunk ahead at most, so a client pays for what it
	// holds by sending it. Default DefaultMaxBodyBufferBytes. At least 2 × MaxBodyBytes: one
	// body at the cap is held twice while its chunks are joined.
	MaxBodyBufferBytes int64
	// ConnectTimeout bounds dialling an engine: 2 s; loopback or in-cluster connects take
	// microseconds, and a connect error is retried on another node, so waiting long only delays
	// the retry.
	ConnectTimeout time.Duration
	// UpstreamTimeout bounds a whole upstream request, 0 (default) for none: generation time
	// grows with max_tokens, so the client's own deadline (its context) is the right bound.
	UpstreamTimeout time.Duration
	// BodyTimeout bounds reading a request's body, counted from admission: 10 s carries the
	// 8 MiB body cap over a 7 Mbit/s link, while a client that stalls its upload holds an
	// admission slot for at most that long (without it five stalled uploads locked a
	// --max-inflight=5 router out for good). Answered 408.
	BodyTimeout time.Duration
	// FirstByteFloor and FirstByteCeiling bound the wait for the first byte of a streaming
	// request's response from the engine (headers and the first body bytes), which is firstByteSlack × the node's expected time to first
	// token (its queued plus this request's uncached prefill at its prefill rate) clamped to
	// [floor, ceiling]. The floor, 2 s, absorbs scheduling and load-report staleness for short
	// prompts; the ceiling, 60 s, is the longest a healthy engine's queue should make a client
	// wait before another node is better. A timeout counts as a node failure (passive health)
	// and is retried once elsewhere.
	FirstByteFloor, FirstByteCeiling time.Duration
	// StreamIdleTimeout ends a relayed stream that has sent nothing for this long: 60 s, far
	// beyond any decode step (milliseconds) and a long chunked prefill, so only a hung or cut
	// engine hits it. The client gets an SSE error event; the node a failure.
	StreamIdleTimeout time.Duration
	// CORSOrigins, when not empty, answers browsers from these origins ("*" for any) with CORS
	// headers and preflight responses; empty (default) sends none, as vLLM without
	// --allowed-origins.
	CORSOrigins []string
	// TLS, when set, makes the server speak HTTPS (set ClientAuth for mTLS from clients).
	TLS *tls.Config
	// UpstreamTLS, when set, is used for https:// engine URLs (client certificates for mTLS
	// toward the nodes).
	UpstreamTLS *tls.Config
	// MaxIdleConnsPerHost keeps this many idle connections to each engine: 256, so a burst of
	// concurrent requests to one node reuses connections instead of dialling (Go's default of
	// 2 would reopen connections under any concurrency).
	MaxIdleConnsPerHost int
	// TracerProvider, when set and not the no-op provider (internal/tracing), traces each
	// generation request: a server span (parent from the client's traceparent), admission,
	// tokenize, decide, one upstream span per attempt with first_byte under it, and the
	// attempt's traceparent sent to the engine. nil (default): no span work at all.
	TracerProvider trace.TracerProvider
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{
		Tokenizer:           tokenizer.CL100kBase,
		MaxInFlight:         4096,
		MaxBodyBytes:        MaxBodyBytes,
		MaxBodyBufferBytes:  DefaultMaxBodyBufferBytes,
		ConnectTimeout:      2 * time.Second,
		MaxIdleConnsPerHost: 256,
		BodyTimeout:         10 * time.Second,
		FirstByteFloor:      2 * time.Second,
		FirstByteCeiling:    time.Minute,
		StreamIdleTimeout:   time.Minute,
	}
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	switch {
	case c.MaxInFlight <= 0:
		return fmt.Errorf("%w: MaxInFlight %d must be positive", ErrConfig, c.MaxInFlight)
	case c.MaxBodyBytes <= 0:
		return fmt.Errorf("%w: MaxBodyBytes %d must be positive", ErrConfig, c.MaxBodyBytes)
	case c.MaxBodyBufferBytes < 2*c.MaxBodyBytes:
		return fmt.Errorf("%w: MaxBodyBufferBytes %d must hold twice MaxBodyBytes %d (one body at the cap, while it is joined)", ErrConfig, c.MaxBodyBufferBytes, c.MaxBodyBytes)
	case c.ConnectTimeout <= 0:
		return fmt.Errorf("%w: ConnectTimeout %v must be positive", ErrConfig, c.ConnectTimeout)
	case c.UpstreamTimeout < 0:
		return fmt.Errorf("%w: UpstreamTimeout %v must not be negative", ErrConfig, c.UpstreamTimeout)
	case c.BodyTimeout <= 0:
		return fmt.Errorf("%w: BodyTimeout %v must be positive", ErrConfig, c.BodyTimeout)
	case c.FirstByteFloor <= 0 || c.FirstByteCeiling < c.FirstByteFloor:
		return fmt.Errorf("%w: FirstByteFloor %v and FirstByteCeiling %v must be positive and ordered", ErrConfig, c.FirstByteFloor, c.FirstByteCeiling)
	case c.StreamIdleTimeout <= 0:
		return fmt.Errorf("%w: StreamIdleTimeout %v must be positive", ErrConfig, c.StreamIdleTimeout)
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
