// Package extproc is the router's endpoint picker for Kubernetes inference gateways: an Envoy
// ext_proc server (envoy.service.ext_proc.v3.ExternalProcessor) speaking the Gateway API
// Inference Extension's endpoint-picker protocol (kubernetes-sigs/gateway-api-inference-extension,
// docs/proposals/004-endpoint-picker-protocol). The gateway keeps proxying; for every request it
// opens one stream, sends the request's headers and body, and the picker answers with the
// engine to use, as `ip:port` in the x-gateway-destination-endpoint header and in the dynamic
// metadata namespace envoy.lb, followed by a comma-separated fallback list, best first.
//
// The decision is the front door's (router/frontdoor Server.PickForGateway): the same parse,
// tokenizer, candidate filter (health, ejections, pins, draining, caps), routing.Decider and
// in-flight accounting, so a request routed here counts against a node exactly as one proxied
// by the front door, and two doors never disagree. The response then flows back through the
// stream unchanged; the picker reads x-gateway-destination-endpoint-served (the node that
// really served, after the gateway's retries) and the engine's
// usage.prompt_tokens_details.cached_tokens, streamed or not, to close the loop on the node that
// served (after a fallback, the served node owns the request): in-flight count, the overlay's
// pending prefix at the first token, estimate accuracy, passive health.
//
// Body modes, as Envoy's ext_proc filter sends them (envoy/extensions/filters/http/ext_proc/v3
// processing_mode.proto, and GIE's pkg/epp/handlers/server.go):
//
//	FULL_DUPLEX_STREAMED  headers, then body chunks: the headers response is held until the
//	                      body ends, then the headers response (destination, Content-Length)
//	                      and the body, unchanged, in chunks of at most 62,000 bytes
//	BUFFERED              the headers are answered at once (Envoy sends the body only then);
//	                      the one body message is answered with the destination as a header
//	                      mutation and the body left as it is
//	STREAMED, NONE        the body is not seen before the headers must be answered: routed by
//	                      load at the headers, each chunk answered unchanged
//
// A request without a body, or whose body is not an OpenAI generation request, is routed by load
// alone and never refused for it. A subset hint (filter metadata envoy.lb.subset_hint, key
// x-gateway-destination-endpoint-subset) limits the choice to the listed endpoints; none eligible
// is an ImmediateResponse 503, and every candidate over its load bound a 429 with Retry-After.
// Streams are bounded: body bytes per stream and across streams, the number of streams, the
// time to the end of the request body, and a stream's whole life.
package extproc
