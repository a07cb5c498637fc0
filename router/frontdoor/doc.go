// Package frontdoor is the router's OpenAI-compatible HTTP front door (docs/architecture.md, "One
// request"), an HTTP codec over the request service (router/requests), which admits, parses,
// tokenises, decides and closes the loop for every door. For each POST /v1/completions or
// /v1/chat/completions it takes an in-flight slot and reads the body once into pooled buffers
// charged to the service's body budget, capped and within Config.BodyTimeout (body.go), has the
// service parse, tokenise and pick, and forwards the original body unchanged to the chosen
// node's engine, relaying the response as it arrives, SSE chunk by chunk and flushed per read,
// while a requests.Observer reads the first token and cached_tokens (proxy.go, relay.go). A
// connect error, a first-byte timeout (streams: no byte within firstByteSlack × the node's
// expected TTFT, clamped; deadline.go), a 429 or a 5xx before anything reached the client is
// retried once on the next-best node; once bytes have been relayed, errors end the stream with an
// SSE error event. A batch of prompts is split into one routed request per prompt and merged
// (batch.go); vLLM's side endpoints are served or passed through (compat.go). Refusals are
// answered as OpenAI errors with their HTTP status (errors.go, flow.go: 429 with Retry-After for
// overload and flow control's sheds, 503 for no node or a drain), and Shutdown drains: new
// requests get 503 with Connection: close while streams in flight finish, up to the caller's
// deadline. Every request is one slog line and feeds the front door's metrics (metrics.go); with
// Config.TracerProvider it is also a trace (trace.go) whose upstream attempt's traceparent the
// engine receives.
package frontdoor
