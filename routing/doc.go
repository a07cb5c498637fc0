// Package routing is the router's pure decision logic (docs/architecture.md, "One request";
// POLICIES.md in this directory). An Index maps canonical block hashes to the set of nodes whose
// node-local cache holds them — one 16-byte table slot (hash, node bitmask) per distinct hash,
// bounded in (hash, node) pairs and in bytes — fed in order by each node's summary deltas and
// snapshots (epoch and sequence checked, gaps reported). Estimate walks a request's hash chain once
// with a shrinking candidate bitmask and returns, for every node, the number of leading blocks it
// holds: exactly that node's PeekMatchedTokens divided by its block size. An Overlay keeps apart
// what the router itself has just sent where (held while a request waits for its first token, then
// for a short TTL), so a burst on a new prefix lands together before the node's own summary says
// so; an estimate is the leading run of index and overlay together. Policies choose a node from
// (request, view of the candidates, matched tokens, now). The default, "prefixmesh", minimises
// (queued prefill tokens + (1 + MissPenalty) × uncached prompt tokens) / prefill rate — the
// expected time to first token, with uncached work weighted for the queueing and cache pollution it
// causes — among the nodes under a bounded-load guard (consistent hashing with bounded loads,
// Mirrokni, Thorup and Zadimoghaddam, 2016), breaking ties by a rendezvous hash of the first block
// so replicas with the same view agree. A node's blocks on lower tiers (CPU, disk, a shared store)
// are in the index under their tier keys; they continue its GPU prefix and are credited by their
// load time, learned per node and tier (tiers.go). Where disaggregated serving runs, PlanPrefill
// decides whether a request's prefill runs on a prefill node and its KV moves (disagg.go).
// Baselines (round-robin, least-loaded, CHWBL, longest-prefix, an SGLang-style gate, Dynamo's
// cost and llm-d's scorer, both with their tier weights) sit beside it for routing/sim; see
// POLICIES.md. A Decider is the router's one decision path over index, overlay and policy — the
// gRPC Route, the HTTP front door and the simulator all decide through it — and holds the router's
// in-flight counts, plus what other routers report of theirs (decider_peers.go): their decisions
// enter the overlay, their loads the candidates' in-flight fields, so replicas route as one
// (POLICIES.md, "Many routers"). In bursts of simultaneous decisions a router waits its turn
// among its peers when the burst could change its choice (concurrency.go learns the bursts,
// decider_admission.go decides the wait; POLICIES.md, "Bursts"). sharesize.go states the sizes and
// packing of those messages. The
// package does no IO, starts no goroutines and reads the clock only through `now` arguments.
package routing
