// Package requests is the router's request service, the one implementation of what its three
// doors share (docs/architecture.md, "One request"). The HTTP front door (router/frontdoor) and
// the gateway's endpoint picker (router/extproc) are codecs that serve every request through
// Service; gRPC Route (router), which answers from its View and never sees the request run,
// takes from here its flow-control request, the prompt cap, the admission wait and the TTFT
// prediction, and decides on the same routing.Decider. A request is admitted (admission.go: the
// in-flight bound, the received-body budget and flow control, router/flow), parsed and tokenised
// exactly as the engine will see it under the one prompt token cap (request.go, tokenize.go),
// then decided: PolicyPicker (policypicker.go) lists the eligible nodes (routing.Eligibility:
// alive, not draining, the model, pins, ejections) from a NodeSource (MirrorNodes reads the
// gossip mirror's, mirror.go) and lets the Decider choose, committing the request in flight and
// its prefix to the overlay until its first token (picker.go). Its end closes the loop: Pick.Done
// with an Outcome, passive health (health.go: consecutive failures eject a node until a probe or
// the view says it is back), the expected TTFT (ttft.go) and the estimate's accuracy against the
// engine's cached_tokens (accuracy.go; observer.go reads the response as it passes). Service
// (service.go) holds these for the doors, with the pooled client toward the engines
// (transport.go) and the size-class buffers the doors hold bodies in (bodypool.go);
// Service.PickForGateway is a gateway's whole request, which the gateway proxies and may move to
// a fallback node (gateway.go, reroute.go); Stack (stack.go) wires service, picker and health
// for cmd/router.
package requests
