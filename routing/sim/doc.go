// Package sim is the trace-driven simulator behind `router sim` (routing/POLICIES.md, "Measured"): it replays a
// request trace (Mooncake JSONL with prefix-chained 512-token block ids expanded to deterministic
// tokens, or Azure CSV with an optional seeded structure of shared system prompts and multi-turn
// conversations) through one routing policy on a fleet of simulated nodes, on a virtual clock
// driven by an event heap ordered by (time, scheduling order), so a run is a pure function of its
// inputs. Each node is the node agent's real code — a local.RadixTree driving a kvpool.Pool of
// BlocksPerNode blocks — inside a continuous-batching engine that runs in steps (kvpool.Step,
// derived from the node's kvpool.Costs rates by kvpool.FromCosts): requests queue FCFS; each
// step is filled as vLLM's scheduler fills one (vllm/v1/core/sched/scheduler.py): the running
// sequences first, one token for a decoding one and the rest of its prompt for a prefilling one,
// up to the token budget (TokenBudget, vLLM's max_num_batched_tokens), then waiting requests are
// admitted (kvpool.Admit: lookup, evict under pressure, allocate prompt and output blocks) while
// budget and one of MaxConcurrent slots remain and the pool has room (a busy pool blocks the
// head until a sequence finishes), their prompts prefilled in chunks (chunked prefill). A step
// takes Fixed + b·prefill tokens + c·decode sequences, so a prompt chunk slows every decode
// sequence sharing its step. At the end of the step each decoding sequence has one more token
// (its inter-token latency, ITL, is the step's time) and a sequence whose last prompt chunk ran
// has its first token (TTFT = arrival to that step's end; its prompt is inserted into the tree);
// after its last token the sequence releases its blocks. With Config.CPUBlocks each node also has
// the simulated engine's CPU KV tier (kvpool.CPUTier behind a kvpool.SpillCache, as vLLM's
// OffloadingConnector): GPU evictions spill into it by chunk, LRU; at admission the run of
// blocks it holds right after the GPU prefix is loaded at the load rate over the node's one
// host-to-GPU lane, the sequence waiting outside the steps meanwhile, before the
// rest is prefilled, and counts as cached. Nodes publish through the real summary path: after
// every change the node's journal delta (the tree's changes, and the CPU tier's under their tier
// keys, local.TierKey) travels to the router's routing.Index with a propagation delay and
// optional loss; a gap (or a load report whose journal head the index has not reached) triggers a
// repair from a snapshot of the summary via ReplaceNode after a repair delay. Load reports (running, waiting, queued prefill tokens, free blocks) travel with
// the same delay. The router side is the real routing.Index, Overlay and Policy, plus its own
// fresh in-flight counts.
//
// With Config.PrefillNodes the fleet is disaggregated: the first nodes run prefill legs only,
// the others decode. The router decides as the daemon does — routing.Decider.Decide over the
// decode-capable nodes (routing.Eligibility), then, per Config.Disaggregate, Decider.PlanPrefill
// over the prefill nodes, or a baseline's rule (llm-d's routing.PlanPrefillLLMD, Dynamo's
// routing.PlanPrefillDynamo) fed only what it uses and committed through PlanPrefill. A remote
// prefill runs on its prefill node (its queue, its steps); its answer sends the decode leg to the
// decode node, which admits it, pulls the KV it lacks at Config.KVTransferTokensPerSec plus
// Config.KVTransferOverhead (the ground truth, which the router only learns through
// Decider.ObserveTransfer from the prefill answer to the decode leg's first token), computes the
// prompt's last token and decodes; the prefill node holds the blocks until the pull is done.
//
// Metrics per policy: token hit ratio at admission, TTFT mean/p50/p99, ITL mean/p99 over every
// gap between consecutive output tokens, end-to-end mean, max/mean imbalance of prefill work and of peak in-flight requests, and the
// share of requests whose estimate for the chosen node equalled the node's actual match (and the
// mean absolute error), and the share of prompt tokens loaded from CPU tiers; References gives
// the pooled-LRU (one tree of Nodes × BlocksPerNode blocks fed sequentially, with a CPU tier of
// Nodes × CPUBlocks behind it when the nodes have one) and infinite-cache hit ratios. The package does no IO, starts no
// goroutines and reads no clock.
package sim
