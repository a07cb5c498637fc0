// Package router answers "which node should serve this prompt" for a prefixmesh router
// (DESIGN.md §6, §8). A View joins the gossip mirror's node list (metadata and reported load,
// cluster.Mirror) with the summary index (routing.Index): for a request it hashes the prompt
// once per block size in use, asks the index how many leading blocks each node holds — the
// node's own PeekMatchedTokens, up to propagation delay — and yields routing.NodeInfo lines and
// matched-token estimates that any routing.Policy can choose from. Server is the gRPC Router
// service over a View and one policy (longest-prefix by default: most matched tokens, ties to
// the least loaded node, then a rendezvous hash of the first block, so replicas with the same
// view agree). Placement pins (DESIGN.md §7) are read through a PinTable, locally: Route and,
// through PinnedPicker, the HTTP front door consider only the nodes a pinned adapter is pinned
// to, and any node for an unpinned one. The HTTP front door and richer policies build on the
// same View.
package router
