// Package flow is the router's flow control, one implementation for its three doors (the HTTP
// front door, gRPC Router.Route and the gateway's endpoint picker): every request asks
// Controller.Admit before it is tokenised and decided. While the fleet serving the request's model
// is not saturated the request passes at once (a few atomics, no lock, no allocation). The fleet is
// saturated when the mean over its nodes of max(waiting/QueueDepth, kvUtil/KVUtil) is at
// least 1, where waiting is the larger of the node's reported queue and this router's requests in
// flight to it beyond what the node reports running, and a node whose load report is older than
// StaleAfter counts as saturated (score 1): the rule of llm-d's saturation detector, read from the
// router's own view. From that mean the controller derives a headroom, the requests that may still
// pass before the mean reaches 1 (each adds at most 1/(nodes × QueueDepth) to it), less the
// requests it admitted that no in-flight count holds yet (not yet decided), and spends it per
// request until the view is read again. While saturated, requests wait in a bounded queue
// per priority class (Critical, Standard, Sheddable): classes are served in strict priority,
// the tenants (fairness ids) of a class in round robin, and each tenant's requests first come
// first served. A request is shed (429) when its class's queue is full, when it has waited its
// class's MaxWait, or when a request of a higher class arrives to a queue full in total and it is
// the newest request of the longest-queued tenant of the lowest class below the arrival
// (displaced). Queued requests are released as headroom appears: on request completion, on
// arrival, and on a periodic re-check of the view (Config.Recheck) that also keeps the headroom of
// the fast path fresh; never a busy loop. Queue is the pure core (no clock, no goroutines, no
// locks); Controller wraps it per model with the blocking Admit.
package flow
