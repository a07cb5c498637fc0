// Package router answers "which node should serve this prompt" for a prefixmesh router
// (docs/architecture.md, "One request"). A View joins the gossip mirror's node list (metadata and reported load,
// cluster.SummaryMirror) with the summary index (routing.Index): for a request it hashes the prompt
// once per block size in use, asks the index how many leading blocks each node holds — the
// node's own PeekMatchedTokens, up to propagation delay — and yields routing.NodeInfo lines and
// matched-token estimates. Server is the gRPC Router service: it lists the View's nodes as
// candidates and decides through a routing.Decider — the same Decider, policy instance, overlay
// and in-flight counts as the HTTP front door's picker (frontdoor.NewDeciderPicker), so one
// request gets one answer whichever door it takes; session ids map to routing.SessionKey on both
// paths, a fixed function, so replicas agree on sessions. A Route decision is recorded in the
// overlay for its TTL and shared with the other routers (router/peershare), not counted in flight:
// the client sends the request itself. Placement pins (docs/architecture.md, "Pins") are read through a
// PinTable, locally: Route and, through PinnedPicker, the HTTP front door consider only the
// nodes a pinned adapter is pinned to, and any node for an unpinned one.
package router
