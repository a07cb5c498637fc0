// Package router is a prefixmesh router's view of the fleet and its gRPC door
// (docs/architecture.md, "One request"). A View (view.go) joins the gossip mirror's node list
// (metadata and reported load, cluster.SummaryMirror) with the summary index (routing.Index): it
// hashes a prompt once per block size in use and asks the index how many leading blocks each
// node holds, the node's own PeekMatchedTokens up to propagation delay. Server (server.go) is the
// gRPC Router service, a codec over what the request service (router/requests) shares with the
// other doors: it lists the View's nodes as candidates with the same eligibility
// (routing.Eligibility), admits through flow control with the same request (flow_grpc.go,
// requests.FlowRequest), holds prompts to the same cap (requests.MaxPromptTokens) and decides
// through the same routing.Decider, policy instance, overlay and in-flight counts as the
// service's PolicyPicker, so one request gets one answer whichever door it takes; session ids
// map to routing.SessionKey on every path, a fixed function, so replicas agree on sessions. A
// Route decision is recorded in the overlay for its TTL and shared with the other routers
// (router/peershare), not counted in flight: the client sends the request itself. Placement
// pins (docs/architecture.md, "Pins") are read through a PinTable, locally (pins.go): Route and,
// through PinnedPicker (pinned_picker.go), the request service consider only the nodes a pinned
// adapter is pinned to, and any node for an unpinned one. FlowSource is flow control's view of
// the fleet (flow_source.go); fleet_metrics.go and ttft_metrics.go export the router's per-node
// view at scrape time.
package router
