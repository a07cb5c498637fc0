// Package sim is the trace-driven simulator behind `router sim` (routing/POLICIES.md, "Measured"): it replays a
// request trace (Mooncake JSONL with prefix-chained 512-token block ids expanded to deterministic
// tokens, or Azure CSV with an optional seeded structure of shared system prompts and multi-turn
// conversations) through one routing policy on a fleet of simulated nodes, on a virtual clock
// driven by an event heap ordered by (time, scheduling order), so a run is a pure function of its
// inputs. Each node is the node agent's real code — a local.RadixTree driving a kvpool.Pool of
// BlocksPerNode blocks with the simulated engine's kvpool.Costs — inside a continuous-batching
// engine model: requests queue FCFS; the head is admitted (kvpool.Admit: lookup, evict under
// pressure, allocate prompt and output blocks) when the node's single prefill stream is idle,
// fewer than MaxConcurrent sequences run and the pool has room (a busy pool blocks the head until
// a sequence finishes); its uncached tokens are prefilled sequentially at the prefill rate — the
// cost model's PrefillTime, the same charge the live simulated engine makes — after which the
// prompt is inserted into the tree and the first token is out (TTFT = arrival to end of prefill);
// output tokens then decode at the per-sequence decode rate, concurrently with everything else,
// and the finished sequence releases its blocks. With Config.CPUBlocks each node also has the
// simulated engine's CPU KV tier (kvpool.CPUTier behind a kvpool.SpillCache, as vLLM's
// OffloadingConnector): GPU evictions spill into it by chunk, LRU; at admission the run of blocks
// it holds right after the GPU prefix is loaded at the load rate on the prefill stream before the
// rest is prefilled, and counts as cached. Nodes publish through the real summary path: after
// every change the node's journal delta (the tree's changes, and the CPU tier's under their tier
// keys, local.TierKey) travels to the router's routing.Index with a propagation delay and
// optional loss; a gap (or a load report whose journal head the index has not reached) triggers a
// repair from a snapshot of the summary via ReplaceNode after a repair delay. Load reports (running, waiting, queued prefill tokens, free blocks) travel with
// the same delay. The router side is the real routing.Index, Overlay and Policy, plus its own
// fresh in-flight counts. Metrics per policy: token hit ratio at admission, TTFT mean/p50/p99,
// end-to-end mean, max/mean imbalance of prefill work and of peak in-flight requests, and the
// share of requests whose estimate for the chosen node equalled the node's actual match (and the
// mean absolute error), and the share of prompt tokens loaded from CPU tiers; References gives
// the pooled-LRU (one tree of Nodes × BlocksPerNode blocks fed sequentially, with a CPU tier of
// Nodes × CPUBlocks behind it when the nodes have one) and infinite-cache hit ratios. The package does no IO, starts no
// goroutines and reads no clock.
package sim
