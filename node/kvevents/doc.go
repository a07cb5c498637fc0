// Package kvevents mirrors a real engine's prefix cache from its KV events: vLLM
// and SGLang publish every change to their cache on a ZMQ PUB socket as msgpack batches,
// [topic, seq (8 bytes big-endian), payload], where the payload is [ts, events, dp_rank] and an
// event is BlockStored, BlockRemoved or AllBlocksCleared, as a tagged positional array or a map
// keyed by "type" (docs/engine-integration.md has the layouts and versions). Decoder reads both
// shapes, hashes of any integer width or as bytes, and skips and counts unknown tags and fields
// without failing the batch. CacheMirror applies the events: blocks chained by parent hash and token
// ids, the engine's hashes kept as opaque keys beside the canonical chained hash routers compute,
// copies counted, interior removals ending matches as in the engine; it answers
// PeekMatchedTokens and keeps the summary journal the gossip agent publishes, so it stands in for
// the node's local.RadixTree. Copies beyond the GPU (Tier: cpu, disk, storage, remote, other)
// are kept per block, never matched, and answered per tier by PeekMatchedTokensByTier; copies
// of a tier that never sends removals age out (Config.UnremovedTierTTL). Follower runs one subscription per data-parallel rank and keeps the
// mirror in order: gaps are replayed from the engine's ROUTER replay socket, a sequence that goes
// back drops the mirror, and a stream that cannot be recovered (or a batch that does not decode
// whole) is cleared and rebuilt, partial: a lower bound of the engine's cache, still credited.
// A mirror is cold (no affinity from it) only while it may hold blocks the engine lost: one
// restored from a checkpoint (checkpoint.go) until the gap since is settled. An event of a
// kind this package does not know is skipped and counted when it names no blocks (it cannot
// have taken one away); one that names blocks, or has no readable tag, may have removed them,
// so its batch counts as not decoded whole.
//
// The follower is split as etcd's raft is: each rank's logic is a pure state machine
// (rankMachine, rankmachine.go) whose methods take one input (a live batch and its sequence,
// one batch of a replay answer or the end of a replay round, a probe's answer, an idle tick,
// the engine's restart signal, the start from a restored checkpoint, with the clock passed in)
// and return the ordered actions that follow (apply these events, clear the rank, record its
// position, set complete or cold, count, log, call OnRestart or OnComplete, re-arm the idle
// timer, and at most one replay or probe exchange, always last). The driver (driver.go) owns
// every socket, the replay DEALER exchanges and the timer; it executes the actions and feeds
// each exchange's answer back. So every transition can be scripted: testdata/follower holds
// the scenarios, one story per file, run by trace_test.go against a real CacheMirror.
//
// Publisher and
// Encoder are the producing side, vLLM's wire format exactly: the simulated engine publishes its
// cache changes with them. Every socket goes through a guarded ZMQ transport (zmtp.go) that caps
// frame sizes, bounds handshakes and drains go-zeromq's readers before a socket closes.
package kvevents
