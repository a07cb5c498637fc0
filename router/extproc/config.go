package extproc

import (
	"errors"
	"fmt"
	"time"

	procv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"go.opentelemetry.io/otel/trace"
)

// ErrConfig is wrapped by every Validate error.
var ErrConfig = errors.New("extproc: invalid config")

// Protocol names, as GIE's endpoint-picker protocol defines them.
const (
	// HeaderDestination carries the chosen endpoint (and fallbacks) to the gateway.
	HeaderDestination = "x-gateway-destination-endpoint"
	// HeaderPrefiller names a disaggregated request's prefill endpoint (ip:port) to llm-d's P/D
	// sidecar on the decode node, which runs the prefill leg there (docs/disaggregation.md).
	HeaderPrefiller = "x-prefiller-host-port"
	// HeaderKVSource names the peer (ip:port of its KV endpoint) the chosen node pulls the
	// prompt's cached prefix from, as llm-d's router tells its sidecar (a peer pull).
	HeaderKVSource = "x-kv-cache-source-host-port"
	// MetadataNamespace is the dynamic-metadata namespace of the destination and of the served
	// endpoint the gateway reports back.
	MetadataNamespace = "envoy.lb"
	// KeyServed is the served endpoint's key in the response's metadata context.
	KeyServed = "x-gateway-destination-endpoint-served"
	// SubsetNamespace and KeySubset carry the gateway's subset hint.
	SubsetNamespace = "envoy.lb.subset_hint"
	KeySubset       = "x-gateway-destination-endpoint-subset"
)

// MaxChunkBytes is the largest body chunk sent back in a streamed body response: GIE's
// pkg/common/envoy BodyByteLimit, 62,000 bytes, under the 64 KiB some Envoy builds allow per
// streamed chunk.
const MaxChunkBytes = 62000

// Config configures the endpoint picker.
type Config struct {
	// MaxBodyBytes caps one request body; more is answered 413. Default 8 MiB, the front
	// door's cap, so both doors accept the same requests.
	MaxBodyBytes int
	// MaxBufferedBytes caps the request body bytes held across all streams at once; a body that
	// would go over is answered 429 (the gateway may retry). Default 512 MiB: 64 bodies at the
	// cap, or thousands of ordinary chat bodies, while the router's memory stays bounded.
	MaxBufferedBytes int64
	// MaxStreams caps concurrent streams; one more is answered 429 at its first message.
	// Default 16,384: each idle stream costs a few KiB (gRPC's buffers and two goroutines).
	MaxStreams int
	// RequestTimeout bounds the time from a stream's first message to the end of the request
	// body (a gateway that stops sending mid-body): then 408. Default 30 s, generous for an
	// 8 MiB body over a slow client, since Envoy streams the body as the client sends it.
	RequestTimeout time.Duration
	// MaxStreamDuration bounds a stream's whole life, response included: a stream still open
	// then is ended (the request is counted as failed). Default 1 h: a long generation.
	MaxStreamDuration time.Duration
	// Fallbacks is how many next-best endpoints follow the chosen one in the destination list
	// (comma-separated, best first, in the header and the metadata alike). Default 0: a plain
	// ORIGINAL_DST cluster reads the header as one address and fails on a list; gateways that
	// walk the list on retries (Envoy's override_host load-balancing policy,
	// envoy/extensions/load_balancing_policies/override_host/v3) take 1 or 2.
	Fallbacks int
	// DefaultRequestBodyMode and DefaultResponseBodyMode are assumed when the gateway does not
	// send protocol_config (Envoy before 1.34): FULL_DUPLEX_STREAMED, GIE's reference config.
	DefaultRequestBodyMode  procv3.ProcessingMode_BodySendMode
	DefaultResponseBodyMode procv3.ProcessingMode_BodySendMode
	// TracerProvider, when set and not the no-op provider (internal/tracing), traces each
	// request the gateway streams: a span (parent from the request's traceparent) with the front
	// door's tokenize and decide under it, ended with the response, and a traceparent header
	// mutation carrying it, so the engine's spans join the trace. nil (default): no span work.
	TracerProvider trace.TracerProvider
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{
		MaxBodyBytes:            8 << 20,
		MaxBufferedBytes:        512 << 20,
		MaxStreams:              16384,
		RequestTimeout:          30 * time.Second,
		MaxStreamDuration:       time.Hour,
		Fallbacks:               0,
		DefaultRequestBodyMode:  procv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		DefaultResponseBodyMode: procv3.ProcessingMode_FULL_DUPLEX_STREAMED,
	}
}

// Validate reports the first invalid field.
func (c *Config) Validate() error {
	switch {
	case c.MaxBodyBytes <= 0:
		return fmt.Errorf("%w: MaxBodyBytes %d must be positive", ErrConfig, c.MaxBodyBytes)
	case c.MaxBufferedBytes < int64(c.MaxBodyBytes):
		return fmt.Errorf("%w: MaxBufferedBytes %d must hold at least one body of MaxBodyBytes %d", ErrConfig, c.MaxBufferedBytes, c.MaxBodyBytes)
	case c.MaxStreams <= 0:
		return fmt.Errorf("%w: MaxStreams %d must be positive", ErrConfig, c.MaxStreams)
	case c.RequestTimeout <= 0 || c.MaxStreamDuration < c.RequestTimeout:
		return fmt.Errorf("%w: RequestTimeout %v must be positive and at most MaxStreamDuration %v", ErrConfig, c.RequestTimeout, c.MaxStreamDuration)
	case c.Fallbacks < 0:
		return fmt.Errorf("%w: Fallbacks %d must not be negative", ErrConfig, c.Fallbacks)
	}
	return nil
}

// MaxRecvMsgBytes is the gRPC message size the server must accept for cfg: a BUFFERED body
// arrives as one message, well over gRPC's default 4 MiB, plus the headers around it.
func (c *Config) MaxRecvMsgBytes() int { return c.MaxBodyBytes + 1<<20 }
