// Package node is the node agent's gRPC face: Server implements the prefixmesh.v1 NodeCache
// service over the node's one local.RadixTree, so that engines which delegate their prefix cache,
// and routers confirming an estimate or repairing a gossip gap, reach the same tree the agent
// summarises. Every request is validated at the edge against named limits (validate.go) and
// rejected with InvalidArgument, naming the field, before it touches the cache; handlers then map
// one RPC to one PrefixCache call and convert the result (server.go). GetSummary streams the
// tree's block-hash set, or the net changes since a journal sequence number, in bounded chunks
// (summary.go). A unary and a stream interceptor count and time every call by method and code on
// a caller-supplied Prometheus registry, log through log/slog and turn a handler panic into
// Internal (metrics.go). The package starts no goroutines; the daemon in cmd/node owns the
// listeners and the grpc.Server.
package node
