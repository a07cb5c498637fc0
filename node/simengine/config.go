package simengine

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/prefixmesh/prefixmesh/internal/tokenizer"
	"github.com/prefixmesh/prefixmesh/local/kvpool"
	"github.com/prefixmesh/prefixmesh/node/kvevents"
)

// Config configures the simulated engine. Flags of `node --engine=sim` map to it one to one.
type Config struct {
	// BlockSize is the tokens per KV block: 16, vLLM's default, so cache hits are
	// block-aligned the way the fleets we route for see them.
	BlockSize int
	// KVBlocks is the pool size: 32768 blocks × 16 tokens = 512k tokens, the KV capacity of
	// one 80 GB GPU serving an 8B model, so the demo sees pressure only when it asks for it.
	KVBlocks int
	// Model is the name served on /v1/models and accepted in requests ("Model:adapter" selects
	// an adapter).
	Model string
	// PrefillTokensPerSec is the prompt throughput of a step: 10k tok/s, the order of an 8B
	// model on one GPU, so an uncached 4k prompt prefilled alone costs ~0.4 s. With
	// DecodeTokensPerSec it sets the step model (kvpool.FromCosts, step.go).
	PrefillTokensPerSec float64
	// DecodeTokensPerSec is one sequence's output rate in a decode-only step of
	// kvpool.RefDecodeSeqs sequences: 50 tok/s, a typical interactive stream.
	DecodeTokensPerSec float64
	// TokenBudget is the most tokens one step schedules, prompt chunks and decode tokens
	// together: 8192, vLLM's max_num_batched_tokens on an H100-class GPU
	// (kvpool.DefaultTokenBudget), the trace simulator's default too. A longer prompt is
	// prefilled in chunks of at most this many tokens, one a step.
	TokenBudget int
	// MaxConcurrent is how many sequences run (prefill or decode) at once: 64, a common batch
	// size cap (vLLM max_num_seqs is 128–256 on larger GPUs).
	MaxConcurrent int
	// MaxQueue is how many requests may wait for a slot or for KV blocks before the engine
	// answers 429: 256, four batches, a few seconds of backlog at demo rates.
	MaxQueue int
	// Tokenizer names the tokenizer (internal/tokenizer): cl100k_base, the router's default,
	// so both compute the same token ids; bytes; or hf:DIR, a real model's tokenizer.json and
	// chat template, so the engine computes the ids vLLM would for that model.
	Tokenizer string
	// MaxBodyBytes caps a request body: 8 MiB, the router front door's cap (frontdoor.MaxBodyBytes),
	// so whatever a router forwards the engine accepts; it holds a 128k-token prompt as a JSON id
	// array (~7 bytes per id) twice over and keeps one request from exhausting memory.
	MaxBodyBytes int64
	// CPUBlocks is the CPU KV tier's capacity in GPU-sized blocks: 0, off, as vLLM runs without
	// its OffloadingConnector. When set, every full chunk the GPU pool evicts spills into it
	// (kvpool.CPUTier), LRU makes room, and a request's GPU prefix is continued by the blocks the
	// tier holds, loaded back at CPULoadTokensPerSec instead of prefilled. It must be a multiple
	// of CPUChunkBlocks and at most MaxCPUBlocks.
	CPUBlocks int
	// CPUChunkBlocks is how many GPU blocks make one CPU block (vLLM's offloaded block_size over
	// the GPU block_size): 1, vLLM's default (vllm/v1/kv_offload/spec.py: OffloadingSpec reads
	// kv_connector_extra_config["block_size"], defaulting to the GPU block size). A chunk is
	// offloaded, loaded and evicted whole, and its event names all its blocks.
	CPUChunkBlocks int
	// CPULoadTokensPerSec is the rate at which CPU-held tokens are loaded back into the GPU:
	// 150,000 tok/s, 15× the prefill default. vLLM's KV-offloading blog
	// (https://vllm.ai/blog/2026-01-08-kv-offloading-connector) measures ~50 GB/s one-way
	// GPU↔CPU DMA on an H100 and ~2 MB per 16-token block of Llama-3.1-8B (≈128 KiB a token):
	// ≈2.6 µs to load a token, against ≈40 µs to prefill one (2·8e9 FLOP at ~400 TFLOP/s), about
	// 15×, within the 2–22× TTFT gain the blog reports for CPU hits.
	CPULoadTokensPerSec float64
	// EngineID names this engine to the engines that pull KV from it (vLLM's
	// KVTransferConfig.engine_id, sent as kv_transfer_params.remote_engine_id and checked by the
	// side channel): "" picks a random one at New, as vLLM draws a uuid4 (vllm/config/kv_transfer.py).
	EngineID string
	// KVSideChannel is the loopback or LAN address (host:port) the engine binds at Start for
	// other engines to pull KV from (kvtransfer.go): vLLM's NIXL side channel
	// (VLLM_NIXL_SIDE_CHANNEL_HOST/PORT), a listener of its own beside the OpenAI API.
	// 127.0.0.1:0, an ephemeral loopback port, so that several engines share a host and nothing
	// is exposed by default; "" runs the engine without a KV connector, and kv_transfer_params
	// are then ignored as by a vLLM started without --kv-transfer-config.
	KVSideChannel string
	// KVSideChannelHost is the host advertised as remote_host: "" advertises KVSideChannel's own
	// host, which must then name a host others can dial (not a wildcard such as 0.0.0.0).
	KVSideChannelHost string
	// KVLeaseDuration is how long a prefill leg's blocks stay pinned for a decode engine to pull:
	// 30 s, vLLM's kv_lease_duration default
	// (vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_scheduler.py). A waiting puller
	// renews it every KVLeaseDuration/6, vLLM's heartbeat interval there.
	KVLeaseDuration time.Duration
	// KVTransferTokensPerSec is the rate at which pulled KV arrives, charged in simulated time
	// for the pulled tokens only: 100,000 tok/s, 10× the prefill default. A 100 Gb/s NIC
	// (12.5 GB/s) moving ≈128 KiB of Llama-3.1-8B KV a token (the figure CPULoadTokensPerSec
	// uses) carries ≈95k tokens/s; the 400 Gb/s RDMA NICs NIXL deployments use carry 4× that.
	KVTransferTokensPerSec float64
	// KVLoadFailurePolicy is what a decode leg does when its pull fails (peer gone, lease
	// expired, blocks refused): "recompute" (vLLM's default: prefill locally) or "fail" (answer
	// 500, as vLLM finishes the request with an error), vLLM's
	// KVTransferConfig.kv_load_failure_policy (vllm/config/kv_transfer.py).
	KVLoadFailurePolicy string
	// KVRecomputeThreshold: a decode leg whose pull would move fewer tokens than this recomputes
	// them instead, as vLLM's kv_recompute_threshold (nixl/base_scheduler.py,
	// nixl/pull_scheduler.py _should_recompute_remote_kv); 0, vLLM's default for prefill→decode
	// pulls, always pulls.
	KVRecomputeThreshold int
	// KVEvents, when KVEvents.Endpoint is set, publishes the engine's cache changes as vLLM KV
	// events (ZMQ PUB, msgpack; node/kvevents), so a node agent in --engine vllm mode mirrors this
	// engine exactly as it mirrors vLLM. Off by default: the built-in agent reads the tree directly.
	KVEvents kvevents.PublisherConfig
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{
		BlockSize:           16,
		KVBlocks:            32768,
		Model:               "prefixmesh-sim",
		PrefillTokensPerSec: 10000,
		DecodeTokensPerSec:  50,
		TokenBudget:         kvpool.DefaultTokenBudget,
		MaxConcurrent:       64,
		MaxQueue:            256,
		Tokenizer:           tokenizer.CL100kBase,
		MaxBodyBytes:        8 << 20,
		CPUChunkBlocks:      1,
		CPULoadTokensPerSec: 150000,
		KVEvents:            kvevents.PublisherConfig{BufferSteps: 10000, QueueLen: 100000},

		KVSideChannel:          "127.0.0.1:0",
		KVLeaseDuration:        30 * time.Second,
		KVTransferTokensPerSec: 100000,
		KVLoadFailurePolicy:    PolicyRecompute,
	}
}

// MaxCPUBlocks bounds CPUBlocks: 4M blocks, 64M tokens at 16 per block, ~8 TiB of an 8B
// model's KV (≈128 KiB a token), more host memory than any server has; the tier preallocates
// its token ids (4 bytes a token, 256 MiB at this bound) and index, so a typo cannot ask for more.
const MaxCPUBlocks = 1 << 22

// ErrConfig is wrapped by every Validate error.
var ErrConfig = errors.New("invalid simengine config")

// Validate reports the first invalid field.
func (c Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case c.BlockSize <= 0:
		return bad("BlockSize %d must be positive", c.BlockSize)
	case c.KVBlocks <= 0 || c.KVBlocks > kvpool.MaxBlocks:
		return bad("KVBlocks %d outside 1..%d", c.KVBlocks, kvpool.MaxBlocks)
	case c.Model == "":
		return bad("Model is empty")
	case !(c.PrefillTokensPerSec > 0):
		return bad("PrefillTokensPerSec %v must be positive", c.PrefillTokensPerSec)
	case !(c.DecodeTokensPerSec > 0):
		return bad("DecodeTokensPerSec %v must be positive", c.DecodeTokensPerSec)
	case c.TokenBudget <= 0:
		return bad("TokenBudget %d must be positive", c.TokenBudget)
	case c.MaxConcurrent <= 0:
		return bad("MaxConcurrent %d must be positive", c.MaxConcurrent)
	case c.MaxQueue < 0:
		return bad("MaxQueue %d must not be negative", c.MaxQueue)
	case c.MaxBodyBytes <= 0:
		return bad("MaxBodyBytes %d must be positive", c.MaxBodyBytes)
	case c.CPUBlocks < 0 || c.CPUBlocks > MaxCPUBlocks:
		return bad("CPUBlocks %d outside 0..%d", c.CPUBlocks, MaxCPUBlocks)
	case c.CPUChunkBlocks <= 0:
		return bad("CPUChunkBlocks %d must be positive", c.CPUChunkBlocks)
	case c.CPUBlocks%c.CPUChunkBlocks != 0:
		return bad("CPUBlocks %d must be a multiple of CPUChunkBlocks %d (the tier holds whole chunks)", c.CPUBlocks, c.CPUChunkBlocks)
	case !(c.CPULoadTokensPerSec > 0):
		return bad("CPULoadTokensPerSec %v must be positive", c.CPULoadTokensPerSec)
	}
	if err := c.step().Validate(); err != nil {
		return bad("%v", err)
	}
	if err := c.validateKVTransfer(); err != nil {
		return bad("%v", err)
	}
	if strings.HasPrefix(c.Tokenizer, tokenizer.RenderPrefix) {
		return bad("Tokenizer %q: the engine tokenizes itself (cl100k_base, bytes or %sDIR)", c.Tokenizer, tokenizer.HFPrefix)
	}
	if c.KVEvents.Endpoint != "" && (c.KVEvents.BufferSteps <= 0 || c.KVEvents.QueueLen <= 0) {
		return bad("KVEvents buffer %d and queue %d must be positive", c.KVEvents.BufferSteps, c.KVEvents.QueueLen)
	}
	if _, err := tokenizer.New(c.Tokenizer); err != nil {
		return bad("Tokenizer: %v", err)
	}
	return nil
}

func (c Config) costs() kvpool.Costs {
	return kvpool.Costs{PrefillTokensPerSec: c.PrefillTokensPerSec, DecodeTokensPerSec: c.DecodeTokensPerSec,
		LoadTokensPerSec: c.CPULoadTokensPerSec}
}

// step is the engine's step model, derived from the rates exactly as the trace simulator derives
// its nodes' (routing/sim, node.go), so the two charge the same time for the same steps.
func (c Config) step() kvpool.Step { return kvpool.FromCosts(c.costs(), c.TokenBudget) }

// The kv_load_failure_policy values (vllm/config/kv_transfer.py).
const (
	PolicyRecompute = "recompute"
	PolicyFail      = "fail"
)

// maxEngineID bounds EngineID: it travels in every prefill response and side-channel request.
const maxEngineID = 256

// validateKVTransfer checks the KV connector's fields.
func (c Config) validateKVTransfer() error {
	switch {
	case len(c.EngineID) > maxEngineID:
		return fmt.Errorf("EngineID: longer than %d bytes", maxEngineID)
	case c.KVLoadFailurePolicy != PolicyRecompute && c.KVLoadFailurePolicy != PolicyFail:
		return fmt.Errorf("KVLoadFailurePolicy %q: want %q or %q", c.KVLoadFailurePolicy, PolicyRecompute, PolicyFail)
	case c.KVRecomputeThreshold < 0:
		return fmt.Errorf("KVRecomputeThreshold %d must not be negative", c.KVRecomputeThreshold)
	case c.KVSideChannel == "":
		return nil // no connector: the rest is unused
	case c.KVLeaseDuration <= 0:
		return fmt.Errorf("KVLeaseDuration %v must be positive", c.KVLeaseDuration)
	case !(c.KVTransferTokensPerSec > 0):
		return fmt.Errorf("KVTransferTokensPerSec %v must be positive", c.KVTransferTokensPerSec)
	}
	host, _, err := net.SplitHostPort(c.KVSideChannel)
	if err != nil {
		return fmt.Errorf("KVSideChannel %q: want host:port", c.KVSideChannel)
	}
	if c.KVSideChannelHost == "" && (host == "" || net.ParseIP(host) != nil && net.ParseIP(host).IsUnspecified()) {
		return fmt.Errorf("KVSideChannel %q binds every address: set KVSideChannelHost to the host other engines dial", c.KVSideChannel)
	}
	return nil
}
