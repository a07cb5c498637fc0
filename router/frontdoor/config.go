package frontdoor

import (
	"crypto/tls"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// MaxBodyBytes caps a request body at 8 MiB: a 128k-token prompt as a JSON id array (~7 bytes per
// id) twice over, so whatever an engine accepts passes (the simulated engine accepts exactly this
// much), while one request can still not make the router buffer an unbounded body (the body is
// held in memory once, to be tokenised and replayed on a retry).
const MaxBodyBytes = 8 << 20

// maxErrorBodyBytes bounds how much of a failed (5xx) upstream response is kept to relay if the
// retry fails too: OpenAI-shaped errors are a few hundred bytes.
const maxErrorBodyBytes = 64 << 10

// Config configures the front door (the HTTP side; the request service has its own,
// requests.Config). cmd/router maps its flags to it one to one.
type Config struct {
	// MaxBodyBytes caps request bodies; see the MaxBodyBytes constant. The service's body
	// budget (requests.Config.MaxBodyBufferBytes) must hold at least twice it: one body at the
	// cap is held twice while its chunks are joined.
	MaxBodyBytes int64
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
	// TracerProvider, when set and not the no-op provider (internal/tracing), traces each
	// generation request: a server span (parent from the client's traceparent), admission, one
	// upstream span per attempt with first_byte under it, and the attempt's traceparent sent to
	// the engine; the service's tokenize and decide spans (requests.Config.TracerProvider) go
	// under the server span. nil (default): no span work at all.
	TracerProvider trace.TracerProvider
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{
		MaxBodyBytes:      MaxBodyBytes,
		BodyTimeout:       10 * time.Second,
		FirstByteFloor:    2 * time.Second,
		FirstByteCeiling:  time.Minute,
		StreamIdleTimeout: time.Minute,
	}
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	switch {
	case c.MaxBodyBytes <= 0:
		return fmt.Errorf("%w: MaxBodyBytes %d must be positive", ErrConfig, c.MaxBodyBytes)
	case c.UpstreamTimeout < 0:
		return fmt.Errorf("%w: UpstreamTimeout %v must not be negative", ErrConfig, c.UpstreamTimeout)
	case c.BodyTimeout <= 0:
		return fmt.Errorf("%w: BodyTimeout %v must be positive", ErrConfig, c.BodyTimeout)
	case c.FirstByteFloor <= 0 || c.FirstByteCeiling < c.FirstByteFloor:
		return fmt.Errorf("%w: FirstByteFloor %v and FirstByteCeiling %v must be positive and ordered", ErrConfig, c.FirstByteFloor, c.FirstByteCeiling)
	case c.StreamIdleTimeout <= 0:
		return fmt.Errorf("%w: StreamIdleTimeout %v must be positive", ErrConfig, c.StreamIdleTimeout)
	}
	return nil
}
