// Package cluster is prefixmesh's gossip layer (docs/architecture.md, "One cache change"): every node agent and router is a
// hashicorp/memberlist member whose metadata (meta.go) names its role, node id, epoch and
// addresses. A node agent polls its tree's summary journal every few milliseconds and sends the
// changes as sequence-numbered deltas that each fit one UDP packet (delta.go), best effort and
// directly to every router member, because only routers consume summaries; a periodic state
// packet carries the node's load, head sequence and a checksum of its summary set (state.go).
// A router's mirror (mirror.go) applies the deltas in order per node to its routing index,
// holds reordered packets for a short window, and repairs on a sequence gap, a new epoch, a
// checksum mismatch or silence by pulling the node's full summary over gRPC
// (NodeCache.GetSummary, repair.go) and resuming from its sequence; its connection to each node
// follows membership (closed when the node leaves, restarts or moves, redialled on the repair's
// own schedule). Push/pull anti-entropy
// carries version vectors (antientropy.go) as a backstop. Gossip callbacks never block: they
// copy, enqueue on a bounded queue and count drops. Member leave or death removes the node from
// the index at once. Health (health.go) says whether a member with seeds is part of a cluster at
// all, for the daemons' health checks; memberlist's own log lines, which outsiders can cause one
// packet at a time, are counted and rate-limited (log.go). The Raft pin store lives apart, in
// cluster/pins.
package cluster
