// Package frontdoor is the router's OpenAI-compatible HTTP front door (docs/architecture.md). For each
// POST /v1/completions or /v1/chat/completions it reads the body once (capped, within
// Config.BodyTimeout), parses it with internal/openai (the engine's parser), tokenises the
// prompt exactly as the engine will (text with the configured tokenizer, token-id arrays as they
// are, chat requests through tokenizer.EncodeChat: the model's own template for hf:DIR, the renderer for render:URL), asks a Picker for the node whose cache holds
// the longest useful prefix under the load bound, and forwards the original body unchanged to that
// node's engine, relaying the response as it arrives (SSE chunk by chunk, flushed per read). A
// connect error, a first-byte timeout (streams: no byte of the answer within firstByteSlack × the
// node's expected TTFT, clamped), a 429 or a 5xx before anything reached the client is retried
// once on the next-best node; once bytes have been relayed, errors (the engine's, the idle
// deadline's, the drain deadline's) end the stream with an SSE error event. A batch of prompts is
// split into one routed request per prompt and merged (batch.go). Failures other than 429 feed
// a passive health tracker (Health: N consecutive failures eject a node until a probe or the view
// says it is back). vLLM's side endpoints are served or passed through (compat.go). The
// router's own in-flight requests are bounded by a non-blocking admission counter, so overload is
// answered 429 at once instead of queueing, and Shutdown drains: new requests get 503 with
// Connection: close while streams in flight finish, up to the caller's deadline. PolicyPicker is a
// Picker over the pure routing pieces (routing.Index, routing.Overlay, routing.Policy) and any
// node list (MirrorNodes reads the gossip mirror's), so the whole path runs end to end without the
// cluster; Stack wires the three for cmd/router. Every request is one slog line and feeds the
// metrics, including how often the estimate equalled the engine's cached_tokens; with
// Config.TracerProvider it is also a trace (trace.go), whose upstream attempt's traceparent the
// engine receives.
package frontdoor
