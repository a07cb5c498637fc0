// Package routing is the router's pure decision logic (DESIGN.md §6): a bounded index from
// canonical block hash to the set of nodes whose node-local cache holds that block, fed in order by
// each node's summary deltas and snapshots (epoch and sequence checked, gaps reported); an
// estimator that walks a request's hash chain once with a shrinking candidate set of per-node
// bitmasks and returns, for every node, the number of leading blocks it holds — exactly what that
// node's PeekMatchedTokens would return, divided by its block size; a short-lived in-flight overlay
// of what the router has just sent where, so a burst on a new prefix lands together before the
// node's own summary says so; and routing policies over (request, view of the nodes, estimates).
// The default policy, "prefixmesh", picks the node with the lowest expected time to first token
// ((queued prefill tokens + prompt tokens − matched tokens) / prefill rate) among the nodes under a
// bounded-load guard (consistent hashing with bounded loads, Mirrokni, Thorup and Zadimoghaddam,
// 2016), breaking ties by a rendezvous hash of the first block so two replicas with the same view
// agree. Baselines (round-robin, least-loaded, CHWBL, longest-prefix, an SGLang-style gate and a
// Dynamo-style cost) sit beside it for the trace simulator in routing/sim. The package does no IO,
// starts no goroutines and reads the clock only through `now` arguments.
package routing
