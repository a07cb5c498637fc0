// Package extproc is the router's endpoint picker for Kubernetes inference gateways, an ext_proc
// codec over the request service (router/requests): an Envoy ext_proc server
// (envoy.service.ext_proc.v3.ExternalProcessor) speaking the Gateway API Inference Extension's
// endpoint-picker protocol (kubernetes-sigs/gateway-api-inference-extension,
// docs/proposals/004-endpoint-picker-protocol). The gateway keeps proxying; for every request it
// opens one stream, sends the request's headers and body, and the picker answers with the engine
// to use, as `ip:port` in the x-gateway-destination-endpoint header and in the dynamic metadata
// namespace envoy.lb, followed by a comma-separated fallback list, best first (protocol.go). The
// decision is requests.Service.PickForGateway, every door's parse, tokenizer, eligibility,
// routing.Decider and in-flight accounting, so a request routed here counts against a node
// exactly as one the front door proxies; the response then flows back through the stream
// unchanged while the picker shows it to the pick, which closes the loop on the node that served
// (x-gateway-destination-endpoint-served, after a fallback the served node owns the request).
// stream.go holds one stream's request and response handling, including how each of Envoy's body
// modes is read; server.go the service, its bounds (body bytes per stream and across streams,
// the number of streams, the request's and the stream's time) and grpc.health.v1; codec.go and
// readers.go what keeps a request's answer cheap; metrics.go and trace.go what it reports.
package extproc
