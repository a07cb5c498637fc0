package agentd

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/prefixmesh/prefixmesh/cluster"
	"github.com/prefixmesh/prefixmesh/internal/exposure"
	"github.com/prefixmesh/prefixmesh/internal/flagfile"
	"github.com/prefixmesh/prefixmesh/node"
	"github.com/prefixmesh/prefixmesh/node/kvevents"
	"github.com/prefixmesh/prefixmesh/node/simengine"
)

// Engine modes (--engine).
const (
	engineSim      = "sim"      // the built-in simulated engine serves the OpenAI API on --http-listen
	engineExternal = "external" // a real engine at --engine-url calls NodeCache over gRPC
	engineVLLM     = "vllm"     // vLLM at --engine-url; its cache is mirrored from its KV events
	engineSGLang   = "sglang"   // SGLang at --engine-url; likewise
)

// mirrored reports whether the engine mode mirrors a real engine's KV events.
func mirrored(engine string) bool { return engine == engineVLLM || engine == engineSGLang }

// cacheOwner names what owns the prefix cache of a read-only agent, for the error its NodeCache
// gives a refused write: the simulated engine's KV pool, or a real engine mirrored from its KV
// events.
func cacheOwner(engine string) string {
	if mirrored(engine) {
		return "the " + engine + " engine beside this agent (--engine=" + engine + "; the agent mirrors it from its KV events, and only the engine changes it)"
	}
	return "the in-process simulated engine (--engine=" + engine + ")"
}

// Config is the node agent's configuration; every field maps 1:1 to a flag.
type Config struct {
	// GRPCListen is where NodeCache, grpc.health.v1 and reflection are served: host:port, or
	// unix:///path for a socket shared with an engine on the same host. Default 127.0.0.1:7070,
	// loopback, because the cache API trusts its callers unless mTLS is configured. Both
	// listeners follow the router's rule (internal/exposure, listeners): off loopback, no
	// plaintext without --insecure-grpc / --insecure-http, no TLS without --tls-client-ca
	// unless --tls-no-client-auth.
	GRPCListen string
	// InsecureGRPC allows NodeCache in plaintext on a non-loopback address (never in
	// production: its Insert/Evict/Release can free blocks an engine still uses).
	InsecureGRPC bool
	// TLSNoClientAuth allows --tls-cert without --tls-client-ca on a non-loopback address:
	// encrypted, but any client may call NodeCache.
	TLSNoClientAuth bool
	// HTTPListen serves /metrics, /healthz and, with --engine=sim, the engine's OpenAI API.
	// Default 127.0.0.1:8080, the port OpenAI-compatible engines conventionally use.
	HTTPListen string
	// InsecureHTTP allows the HTTP listener (plaintext: it has no TLS) on a non-loopback address,
	// as routers must reach the simulated engine and Prometheus the metrics; a NetworkPolicy
	// then limits who does (the chart's).
	InsecureHTTP bool
	// NodeID names this node in summaries, stats and gossip. Default: the hostname, which is the
	// pod name under Kubernetes and so unique and stable per pod.
	NodeID string
	// BlockSize is the tokens per KV block the engine inserts with: 16, vLLM's default.
	BlockSize int
	// KVBlocks is the simulated engine's pool size: 32768 blocks × 16 tokens = 512k tokens, one
	// 80 GB GPU's KV capacity for an 8B model.
	KVBlocks int
	// Engine is "sim" (default, so a bare `prefixmesh-node` is a complete demo node),
	// "external", "vllm" or "sglang" (the agent mirrors that engine's cache from its KV events).
	Engine string
	// EngineURL is the engine's base URL (required with --engine=external|vllm|sglang),
	// advertised to routers that proxy requests to it; vllm and sglang are also probed there
	// (GET /health, /metrics, /v1/models).
	EngineURL string
	// Model is the model name the node serves: "prefixmesh-sim", the simulated engine's. With
	// --engine=vllm|sglang and no --model, the engine's first served base model (GET /v1/models).
	Model string
	// Role is the phase of inference this node's engine serves: "both" (the default: whole
	// requests, as every node served before roles existed), or "prefill" or "decode" when
	// prefill and decode run on separate engines (disaggregation). It is gossiped to the
	// routers, which show it and send prefill legs only to prefill nodes (docs/disaggregation.md).
	Role string
	// KVConnector is how the engine moves KV to or from other engines under disaggregation:
	// "nixl" or "sglang"; "" (the default) or "none" when none is configured. Carried and shown
	// like Role, so an operator can see which pools can hand KV to each other.
	KVConnector string
	// SGLangBootstrapPort is the port of the bootstrap server SGLang runs beside a prefill
	// engine, which a decode engine asks where to fetch the KV from: 8998, SGLang's default and
	// llm-d's. Only meaningful with --kv-connector=sglang (given without it, it is refused) and
	// gossiped only then.
	SGLangBootstrapPort int
	// KVPeerAddr is the host:port where other engines pull this engine's KV (vLLM's NIXL side
	// channel as llm-d's P2P connector reaches it), gossiped so that a router can name this
	// node as a peer pull's source; "" announces none. The simulated engine announces its own
	// side channel (--sim-kv-side-channel) when this is empty.
	KVPeerAddr string
	// KVEvents is the engine's KV-event PUB endpoint the agent dials (--kv-events): vLLM binds
	// tcp://*:5557 by default, so tcp://127.0.0.1:5557 from a sidecar. Set KVEventsListen instead
	// for an engine that dials the agent.
	KVEvents string
	// KVEventsListen, when set, is bound by the agent's SUB socket and the engine dials it.
	KVEventsListen string
	// KVEventsReplay is the engine's replay ROUTER endpoint (vLLM's replay_endpoint); "" means
	// none, and a lost message then costs a resync instead of a replay.
	KVEventsReplay string
	// KVEventsTopic is the subscription prefix: "" (vLLM's default topic) takes everything.
	KVEventsTopic string
	// DPSize is the engine's data-parallel size: rank r publishes on port + r. All ranks of one
	// engine are one node (docs/engine-integration.md, "Data parallelism"). Default 1.
	DPSize int
	// TLSCert and TLSKey are the gRPC server's certificate and key (PEM files). Empty: plaintext.
	TLSCert, TLSKey string
	// TLSClientCA, when set, turns on mutual TLS: clients must present a certificate signed by it.
	TLSClientCA string
	// TLSServerName, when set, is the name routers' certificates are verified against when the
	// agent dials them (pins), instead of the dialled address (routers are dialled by pod IP).
	TLSServerName string
	// PinsAddr is a router's gRPC address (in Kubernetes, the router Service) whose pin table the
	// node follows to hold its prefix pins. Default "": with gossip on, any router that runs a
	// pin-store voter, found in gossip; without gossip, no pins.
	PinsAddr string
	// LogLevel is debug, info (default), warn or error.
	LogLevel string
	// DrainTimeout bounds a graceful shutdown: 20 s, under Kubernetes' default 30 s termination
	// grace period so the agent exits on its own before it is killed.
	DrainTimeout time.Duration
	// DrainNotice is the first part of a drain: the agent gossips that it is draining (routers
	// stop choosing it for new requests) and keeps serving, its summary still in every router,
	// before it leaves the cluster. 2 s is several of memberlist's LAN gossip rounds (200 ms), so
	// every router hears it before the node disappears; 0 leaves at once. It takes at most half
	// of DrainTimeout (drainNotice), so a short drain still has time for in-flight calls.
	DrainNotice time.Duration
	// AddrFile, when set, receives the bound addresses once listening ("grpc=… http=…"), for
	// scripts and tests that listen on port 0.
	AddrFile string
	// UnremovedTierTTL, with --engine=vllm|sglang, is how long the mirror believes a copy on a
	// lower tier (CPU, disk, storage) that has not yet sent a removal on its rank:
	// kvevents.DefaultUnremovedTierTTL, 10 minutes, since a tier that never removes (vLLM's
	// LMCache connector forwards only BlockStored) would otherwise be believed forever; 0
	// believes such copies until removed (CacheMirror.SetUnremovedTTL).
	UnremovedTierTTL time.Duration
	// StateDir, with --engine=vllm|sglang, is where the agent checkpoints its mirror of the
	// engine's cache (every 5 s and at exit) and restores it from when it restarts; "" keeps
	// no state.
	StateDir string
	// ValidateOnly parses and validates the configuration, prints "ok" and exits (Helm tests).
	ValidateOnly bool
	// Sim tunes the simulated engine (--sim-*); ignored with --engine=external.
	Sim SimConfig
	// Gossip are the cluster flags shared with the router (--gossip-*, --join,
	// --insecure-gossip). Gossip.Listen empty (the default) runs a standalone node that joins no
	// cluster; set it to publish this node's summary and load to the routers.
	Gossip cluster.Flags
}

// SimConfig are the simulated engine's rate and queue knobs.
type SimConfig struct {
	// PrefillTokensPerSec: 10,000, an 8B model on one GPU; an uncached 4k prompt costs ~0.4 s.
	PrefillTokensPerSec float64
	// DecodeTokensPerSec: 50 per sequence, a typical interactive stream.
	DecodeTokensPerSec float64
	// TokenBudget: 8192 tokens a simulated engine step, vLLM's max_num_batched_tokens on an
	// H100-class GPU (simengine.Config.TokenBudget); the trace simulator's --token-budget default.
	TokenBudget int
	// MaxConcurrent: 64 sequences at once, a common batch cap.
	MaxConcurrent int
	// MaxQueue: 256 waiting requests (four batches) before answering 429.
	MaxQueue int
	// Tokenizer: cl100k_base, the router's default, so both sides compute the same ids; set
	// hf:DIR (a model's tokenizer.json and chat template) to tokenize as vLLM would for it.
	Tokenizer string
	// KVEvents, when set, publishes the simulated engine's cache changes as vLLM KV events on
	// this PUB endpoint (bound), so another agent in --engine vllm mode can mirror it.
	KVEvents string
	// KVEventsReplay, when set, serves replay on this ROUTER endpoint (bound).
	KVEventsReplay string
	// KVEventsLayout is "map" (vLLM ≥ v0.26, the default) or "array" (the older positional form).
	KVEventsLayout string
	// KVEventsHashes is "int" (vLLM's default) or "bytes" (32-byte digests).
	KVEventsHashes string
	// KVEventsTopic is the topic frame ("" as vLLM's default).
	KVEventsTopic string
	// KVEventsReplayTopic puts the topic frame into replay replies, as vLLM ≥ v0.26: true.
	KVEventsReplayTopic bool
	// KVEventsFirstSeq and KVEventsParentZero publish with other publishers' habits (a first
	// sequence of 1, "no parent" as 0), to test a mirroring agent against them.
	KVEventsFirstSeq   uint64
	KVEventsParentZero bool
	// CPUBlocks is the simulated CPU KV tier's size in GPU-sized blocks: 0, off (see
	// simengine.Config.CPUBlocks). CPULoadTokensPerSec is its load rate back into the GPU
	// (150,000 tok/s, 15× the prefill default: simengine.Config.CPULoadTokensPerSec says why),
	// CPUChunkBlocks the GPU blocks per CPU block (1, vLLM's default).
	CPUBlocks           int
	CPULoadTokensPerSec float64
	CPUChunkBlocks      int
	// KVSideChannel is where the simulated engine lets other engines pull KV from it (prefill
	// legs' leased blocks, peer pulls): 127.0.0.1:0, an ephemeral loopback port (the engine
	// answers it in its prefill responses' remote_host/remote_port); "" runs the engine without
	// a KV connector. Off loopback it needs --insecure-http, as the OpenAI listener does, and
	// --sim-kv-side-channel-host when it binds a wildcard address.
	KVSideChannel string
	// KVSideChannelHost is the host advertised as remote_host ("": the bound host).
	KVSideChannelHost string
	// KVLease is how long a prefill leg's blocks stay pinned for a decode engine: 30 s, vLLM's
	// kv_lease_duration default (simengine.Config.KVLeaseDuration).
	KVLease time.Duration
	// KVTransferTokensPerSec is the simulated rate of pulled KV: 100,000 tok/s, a 100 Gb/s NIC
	// for an 8B model (simengine.Config.KVTransferTokensPerSec says why).
	KVTransferTokensPerSec float64
	// KVLoadFailurePolicy is recompute (vLLM's default) or fail, for a decode leg whose pull
	// fails.
	KVLoadFailurePolicy string
	// KVRecomputeThreshold recomputes a decode leg's pull of fewer tokens: 0, vLLM's default.
	KVRecomputeThreshold int
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "prefixmesh-node"
	}
	return Config{
		GRPCListen:   "127.0.0.1:7070",
		HTTPListen:   "127.0.0.1:8080",
		NodeID:       host,
		BlockSize:    16,
		KVBlocks:     32768,
		Engine:       engineSim,
		Model:        "prefixmesh-sim",
		Role:         cluster.ServeBoth.String(),
		LogLevel:     "info",
		DrainTimeout: 20 * time.Second,
		DrainNotice:  2 * time.Second,
		Sim: SimConfig{
			PrefillTokensPerSec: 10000,
			DecodeTokensPerSec:  50,
			TokenBudget:         simengine.DefaultConfig().TokenBudget,
			MaxConcurrent:       64,
			MaxQueue:            256,
			Tokenizer:           simengine.DefaultConfig().Tokenizer,
			KVEventsLayout:      "map",
			KVEventsHashes:      "int",
			KVEventsReplayTopic: true,
			CPULoadTokensPerSec: simengine.DefaultConfig().CPULoadTokensPerSec,
			CPUChunkBlocks:      simengine.DefaultConfig().CPUChunkBlocks,

			KVSideChannel:          simengine.DefaultConfig().KVSideChannel,
			KVLease:                simengine.DefaultConfig().KVLeaseDuration,
			KVTransferTokensPerSec: simengine.DefaultConfig().KVTransferTokensPerSec,
			KVLoadFailurePolicy:    simengine.DefaultConfig().KVLoadFailurePolicy,
		},
		UnremovedTierTTL:    kvevents.DefaultUnremovedTierTTL,
		KVEvents:            "tcp://127.0.0.1:5557",
		DPSize:              1,
		SGLangBootstrapPort: defaultSGLangBootstrapPort,
		Gossip:              cluster.Flags{Label: cluster.DefaultLabel}, // no --gossip-listen: standalone
	}
}

// defaultSGLangBootstrapPort is SGLang's --disaggregation-bootstrap-port default.
const defaultSGLangBootstrapPort = 8998

// maxNodeID bounds --node-id: it travels in gossip metadata, which must fit 512 bytes with
// everything else.
const maxNodeID = 128

// errConfig is wrapped by every Validate error.
var errConfig = errors.New("invalid configuration")

// Validate reports the first invalid field, named by its flag.
func (c Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", errConfig, fmt.Sprintf(format, args...))
	}
	if err := checkListen(c.GRPCListen, true); err != nil {
		return bad("--grpc-listen: %v", err)
	}
	if err := checkListen(c.HTTPListen, false); err != nil {
		return bad("--http-listen: %v", err)
	}
	switch {
	case c.NodeID == "" || len(c.NodeID) > maxNodeID:
		return bad("--node-id %q: must be 1 to %d bytes", c.NodeID, maxNodeID)
	case c.BlockSize <= 0 || c.BlockSize > node.MaxBlockSize:
		return bad("--block-size %d: must be in [1, %d]", c.BlockSize, node.MaxBlockSize)
	case c.KVBlocks <= 0:
		return bad("--kv-blocks %d: must be positive", c.KVBlocks)
	case c.Model == "" && !mirrored(c.Engine):
		return bad("--model: must not be empty")
	case c.DrainTimeout <= 0:
		return bad("--drain-timeout %v: must be positive", c.DrainTimeout)
	case c.DrainNotice < 0:
		return bad("--drain-notice %v: must not be negative", c.DrainNotice)
	case (c.TLSCert == "") != (c.TLSKey == ""):
		return bad("--tls-cert and --tls-key: give both or neither")
	case c.TLSClientCA != "" && c.TLSCert == "":
		return bad("--tls-client-ca: needs --tls-cert and --tls-key (mTLS is TLS plus client certificates)")
	}
	if _, err := exposure.CheckAll(c.listeners()); err != nil {
		return bad("%v", err)
	}
	if c.PinsAddr != "" && !strings.Contains(c.PinsAddr, ":") {
		return bad("--pins-addr %q: want host:port", c.PinsAddr)
	}
	if _, err := parseLogLevel(c.LogLevel); err != nil {
		return bad("--log-level: %v", err)
	}
	if _, err := cluster.ParseServingRole(c.Role); err != nil {
		return bad("--role %q: want prefill, decode or both", c.Role)
	}
	if _, err := cluster.ParseKVConnector(c.KVConnector); err != nil {
		return bad("--kv-connector %q: want nixl or sglang (empty or none: no connector)", c.KVConnector)
	}
	if c.SGLangBootstrapPort < 1 || c.SGLangBootstrapPort > 65535 {
		return bad("--sglang-bootstrap-port %d: must be in [1, 65535]", c.SGLangBootstrapPort)
	}
	if c.KVPeerAddr != "" {
		host, port, err := net.SplitHostPort(c.KVPeerAddr)
		if p, perr := strconv.Atoi(port); err != nil || perr != nil || p < 1 || p > 65535 || host == "" ||
			net.ParseIP(host) != nil && net.ParseIP(host).IsUnspecified() {
			return bad("--kv-peer-addr %q: want the host:port other engines dial (a host, not every address; a port in [1, 65535])", c.KVPeerAddr)
		}
	}
	switch c.Engine {
	case engineSim:
		switch {
		case !(c.Sim.PrefillTokensPerSec > 0):
			return bad("--sim-prefill-tokens-per-s %v: must be positive", c.Sim.PrefillTokensPerSec)
		case !(c.Sim.DecodeTokensPerSec > 0):
			return bad("--sim-decode-tokens-per-s %v: must be positive", c.Sim.DecodeTokensPerSec)
		case c.Sim.TokenBudget <= 0:
			return bad("--sim-token-budget %d: must be positive", c.Sim.TokenBudget)
		case c.Sim.MaxConcurrent <= 0:
			return bad("--sim-max-concurrent %d: must be positive", c.Sim.MaxConcurrent)
		case c.Sim.MaxQueue < 0:
			return bad("--sim-max-queue %d: must not be negative", c.Sim.MaxQueue)
		case c.Sim.KVEventsLayout != "map" && c.Sim.KVEventsLayout != "array":
			return bad("--sim-kv-events-layout %q: must be map or array", c.Sim.KVEventsLayout)
		case c.Sim.KVEventsHashes != "int" && c.Sim.KVEventsHashes != "bytes":
			return bad("--sim-kv-events-hashes %q: must be int or bytes", c.Sim.KVEventsHashes)
		case c.Sim.KVEventsReplay != "" && c.Sim.KVEvents == "":
			return bad("--sim-kv-events-replay: needs --sim-kv-events")
		case c.Sim.CPUBlocks < 0 || c.Sim.CPUBlocks > simengine.MaxCPUBlocks:
			return bad("--sim-cpu-blocks %d: must be in [0, %d] (0: no CPU tier)", c.Sim.CPUBlocks, simengine.MaxCPUBlocks)
		case c.Sim.CPUChunkBlocks <= 0:
			return bad("--sim-cpu-chunk-blocks %d: must be positive (GPU blocks per CPU block)", c.Sim.CPUChunkBlocks)
		case c.Sim.CPUBlocks%c.Sim.CPUChunkBlocks != 0:
			return bad("--sim-cpu-blocks %d: must be a multiple of --sim-cpu-chunk-blocks %d (the CPU tier holds whole chunks)", c.Sim.CPUBlocks, c.Sim.CPUChunkBlocks)
		case !(c.Sim.CPULoadTokensPerSec > 0):
			return bad("--sim-cpu-load-tokens-per-s %v: must be positive", c.Sim.CPULoadTokensPerSec)
		}
		if err := c.validateSimKV(); err != nil {
			return bad("%v", err)
		}
		sc := simengine.DefaultConfig()
		sc.Tokenizer = c.Sim.Tokenizer
		if err := sc.Validate(); err != nil {
			return bad("--sim-tokenizer %q: %v", c.Sim.Tokenizer, err)
		}
		for _, f := range []struct{ flag, ep string }{{"--sim-kv-events", c.Sim.KVEvents}, {"--sim-kv-events-replay", c.Sim.KVEventsReplay}} {
			if f.ep != "" && !strings.HasPrefix(f.ep, "tcp://") {
				return bad("%s %q: want tcp://HOST:PORT", f.flag, f.ep)
			}
		}
	case engineExternal, engineVLLM, engineSGLang:
		u, err := url.Parse(c.EngineURL)
		if c.EngineURL == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return bad("--engine-url %q: --engine=%s needs an http(s)://host[:port] URL", c.EngineURL, c.Engine)
		}
		if mirrored(c.Engine) {
			if c.UnremovedTierTTL < 0 {
				return bad("--unremoved-tier-ttl %v: must not be negative (0 believes lower-tier copies until removed)", c.UnremovedTierTTL)
			}
			if err := c.kvEventsConfig().Validate(); err != nil {
				return bad("%v", err)
			}
		}
	default:
		return bad("--engine %q: must be %q, %q, %q or %q", c.Engine, engineSim, engineExternal, engineVLLM, engineSGLang)
	}
	if c.Gossip.Listen != "" {
		if err := c.Gossip.Validate(); err != nil {
			return bad("%v", err)
		}
	}
	for _, f := range []struct{ flag, path string }{{"--tls-cert", c.TLSCert}, {"--tls-key", c.TLSKey}, {"--tls-client-ca", c.TLSClientCA}} {
		if f.path == "" {
			continue
		}
		if _, err := os.Stat(f.path); err != nil {
			return bad("%s: %v", f.flag, err)
		}
	}
	return nil
}

// validateSimKV checks the simulated engine's KV-connector flags, naming them.
func (c Config) validateSimKV() error {
	switch {
	case c.Sim.KVLoadFailurePolicy != simengine.PolicyRecompute && c.Sim.KVLoadFailurePolicy != simengine.PolicyFail:
		return fmt.Errorf("--sim-kv-load-failure-policy %q: must be %s or %s", c.Sim.KVLoadFailurePolicy, simengine.PolicyRecompute, simengine.PolicyFail)
	case c.Sim.KVRecomputeThreshold < 0:
		return fmt.Errorf("--sim-kv-recompute-threshold %d: must not be negative (0: always pull)", c.Sim.KVRecomputeThreshold)
	case c.Sim.KVSideChannel == "":
		if c.Sim.KVSideChannelHost != "" {
			return fmt.Errorf("--sim-kv-side-channel-host: needs --sim-kv-side-channel")
		}
		return nil
	case c.Sim.KVLease <= 0:
		return fmt.Errorf("--sim-kv-lease %v: must be positive", c.Sim.KVLease)
	case !(c.Sim.KVTransferTokensPerSec > 0):
		return fmt.Errorf("--sim-kv-transfer-tokens-per-s %v: must be positive", c.Sim.KVTransferTokensPerSec)
	}
	host, _, err := net.SplitHostPort(c.Sim.KVSideChannel)
	if err != nil {
		return fmt.Errorf("--sim-kv-side-channel %q: want host:port", c.Sim.KVSideChannel)
	}
	if c.Sim.KVSideChannelHost == "" && (host == "" || net.ParseIP(host) != nil && net.ParseIP(host).IsUnspecified()) {
		return fmt.Errorf("--sim-kv-side-channel %q binds every address: set --sim-kv-side-channel-host to the host other engines dial", c.Sim.KVSideChannel)
	}
	side := exposure.Listener{Name: "simulated engine's KV side channel", ListenFlag: "--sim-kv-side-channel", Addr: c.Sim.KVSideChannel,
		Insecure: c.InsecureHTTP, InsecureFlag: "--insecure-http",
		Exposes: "read the token ids of prompts this engine holds and end its prefill legs' leases"}
	if _, err := side.Check(); err != nil {
		return err
	}
	return nil
}

// listeners are the agent's listeners as internal/exposure's rule sees them, in the order they
// are logged; the KV-event sockets are ZMQ endpoints the engine's side governs (SECURITY.md).
func (c Config) listeners() []exposure.Listener {
	return []exposure.Listener{
		{Name: "NodeCache gRPC", ListenFlag: "--grpc-listen", Addr: c.GRPCListen,
			Cert: c.TLSCert != "", CertFlag: "--tls-cert", ClientCA: c.TLSClientCA != "", ClientCAFlag: "--tls-client-ca",
			Insecure: c.InsecureGRPC, InsecureFlag: "--insecure-grpc", NoClientAuth: c.TLSNoClientAuth, NoClientAuthFlag: "--tls-no-client-auth",
			Exposes: "read this node's cache state and, beside an external engine, insert, evict and release its blocks"},
		{Name: "HTTP (/metrics, /healthz, the simulated engine)", ListenFlag: "--http-listen", Addr: c.HTTPListen,
			Insecure: c.InsecureHTTP, InsecureFlag: "--insecure-http",
			Exposes: "read load figures and, with --engine=sim, send completions to the simulated engine"},
	}
}

// checkListen accepts host:port and, where unixOK, unix:///absolute/path.
func checkListen(addr string, unixOK bool) error {
	if path, ok := strings.CutPrefix(addr, "unix://"); ok {
		if !unixOK {
			return fmt.Errorf("%q: unix sockets are not supported here", addr)
		}
		if !strings.HasPrefix(path, "/") {
			return fmt.Errorf("%q: want unix:///absolute/path", addr)
		}
		return nil
	}
	if !strings.Contains(addr, ":") {
		return fmt.Errorf("%q: want host:port", addr)
	}
	return nil
}

func parseLogLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("%q: want debug, info, warn or error", s)
	}
	return l, nil
}

// newFlagSet binds every Config field to a flag on a fresh FlagSet (no package globals), with
// cfg's values as defaults.
func newFlagSet(cfg *Config, output io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("prefixmesh-node", flag.ContinueOnError)
	fs.SetOutput(output)
	fs.Usage = func() {
		fmt.Fprintf(output, "Usage: prefixmesh-node [flags]\n\n"+
			"The prefixmesh node agent: owns this node's prefix cache and serves it over gRPC\n"+
			"(NodeCache, grpc.health.v1, reflection); with --engine=sim it also runs a simulated\n"+
			"engine speaking the OpenAI API.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	fs.StringVar(&cfg.GRPCListen, "grpc-listen", cfg.GRPCListen, "gRPC listen address: `host:port` or unix:///path (port 0 picks a free port)")
	fs.StringVar(&cfg.HTTPListen, "http-listen", cfg.HTTPListen, "HTTP listen `host:port` for /metrics, /healthz and the simulated engine's OpenAI API")
	fs.BoolVar(&cfg.InsecureGRPC, "insecure-grpc", cfg.InsecureGRPC, "allow plaintext NodeCache gRPC on a non-loopback --grpc-listen without --tls-cert (never in production)")
	fs.BoolVar(&cfg.TLSNoClientAuth, "tls-no-client-auth", cfg.TLSNoClientAuth, "allow --tls-cert without --tls-client-ca on a non-loopback --grpc-listen: TLS without client certificates")
	fs.BoolVar(&cfg.InsecureHTTP, "insecure-http", cfg.InsecureHTTP, "allow the plaintext HTTP listener on a non-loopback --http-listen (limit who reaches it with a NetworkPolicy)")
	fs.StringVar(&cfg.NodeID, "node-id", cfg.NodeID, "this node's `id` in summaries, stats and gossip (the hostname unless set)")
	fs.IntVar(&cfg.BlockSize, "block-size", cfg.BlockSize, "KV block size in `tokens` the engine inserts with")
	fs.IntVar(&cfg.KVBlocks, "kv-blocks", cfg.KVBlocks, "KV pool size in `blocks` (simulated engine)")
	fs.StringVar(&cfg.Engine, "engine", cfg.Engine, "engine `mode`: sim (built-in simulated engine), external (an engine at --engine-url calls NodeCache), vllm or sglang (mirror that engine's cache from its KV events)")
	fs.StringVar(&cfg.EngineURL, "engine-url", cfg.EngineURL, "the engine's base `URL` (with --engine=external|vllm|sglang)")
	fs.StringVar(&cfg.Model, "model", cfg.Model, "model `name` served by this node (vllm/sglang: default the engine's, from /v1/models)")
	fs.StringVar(&cfg.Role, "role", cfg.Role, "the phase of inference this node's engine serves: prefill, decode or both (gossiped; routers send prefill legs only to prefill nodes and whole requests to the others)")
	fs.StringVar(&cfg.KVConnector, "kv-connector", cfg.KVConnector, "the engine's KV `connector` to other engines under prefill/decode disaggregation: nixl or sglang (empty: none)")
	fs.StringVar(&cfg.KVPeerAddr, "kv-peer-addr", cfg.KVPeerAddr, "`host:port` where other engines pull this engine's KV (a peer pull's source; vLLM's NIXL side channel, llm-d's P2P port); empty: none, or the simulated engine's side channel")
	fs.IntVar(&cfg.SGLangBootstrapPort, "sglang-bootstrap-port", cfg.SGLangBootstrapPort, "SGLang's bootstrap `port` beside a prefill engine (with --kv-connector=sglang)")
	fs.StringVar(&cfg.KVEvents, "kv-events", cfg.KVEvents, "the engine's KV-event PUB `endpoint` to dial (tcp://HOST:PORT; --engine=vllm|sglang)")
	fs.StringVar(&cfg.KVEventsListen, "kv-events-listen", cfg.KVEventsListen, "bind this `endpoint` for KV events instead, for an engine that dials the agent")
	fs.StringVar(&cfg.KVEventsReplay, "kv-events-replay", cfg.KVEventsReplay, "the engine's KV-event replay ROUTER `endpoint` (empty: none)")
	fs.StringVar(&cfg.KVEventsTopic, "kv-events-topic", cfg.KVEventsTopic, "KV-event topic `prefix` to subscribe to (empty: all)")
	fs.IntVar(&cfg.DPSize, "dp-size", cfg.DPSize, "the engine's data-parallel `ranks`: rank r publishes on port + r")
	fs.StringVar(&cfg.TLSCert, "tls-cert", cfg.TLSCert, "gRPC server certificate `file` (PEM); empty serves plaintext")
	fs.StringVar(&cfg.TLSKey, "tls-key", cfg.TLSKey, "gRPC server private key `file` (PEM)")
	fs.StringVar(&cfg.TLSClientCA, "tls-client-ca", cfg.TLSClientCA, "CA `file` (PEM) for client certificates; setting it requires mutual TLS")
	fs.StringVar(&cfg.TLSServerName, "tls-server-name", cfg.TLSServerName, "verify routers' certificates against this `name` instead of the dialled address")
	fs.StringVar(&cfg.PinsAddr, "pins-addr", cfg.PinsAddr, "router gRPC `host:port` to follow the pin table from (default: routers found in gossip)")
	fs.StringVar(&cfg.LogLevel, "log-level", cfg.LogLevel, "log `level`: debug, info, warn or error")
	fs.DurationVar(&cfg.DrainTimeout, "drain-timeout", cfg.DrainTimeout, "on SIGTERM, how long to let in-flight calls finish before closing them")
	fs.DurationVar(&cfg.UnremovedTierTTL, "unremoved-tier-ttl", cfg.UnremovedTierTTL, "with --engine=vllm|sglang: how long to believe a copy on a lower tier (CPU, disk) that has not yet sent a removal (0: until removed)")
	fs.StringVar(&cfg.StateDir, "state-dir", cfg.StateDir, "with --engine=vllm|sglang: checkpoint the mirror of the engine's cache in this `directory` and restore it after a restart")
	fs.DurationVar(&cfg.DrainNotice, "drain-notice", cfg.DrainNotice, "on SIGTERM, how long to announce draining (routers send nothing new) before leaving gossip; at most half of --drain-timeout")
	fs.StringVar(&cfg.AddrFile, "addr-file", cfg.AddrFile, "write the bound addresses (\"grpc=… http=…\") to this `file` once listening")
	fs.BoolVar(&cfg.ValidateOnly, "validate-only", cfg.ValidateOnly, "parse and validate flags, print \"ok\" and exit")
	fs.Float64Var(&cfg.Sim.PrefillTokensPerSec, "sim-prefill-tokens-per-s", cfg.Sim.PrefillTokensPerSec, "simulated prefill throughput in `tokens/s`")
	fs.Float64Var(&cfg.Sim.DecodeTokensPerSec, "sim-decode-tokens-per-s", cfg.Sim.DecodeTokensPerSec, "simulated decode rate per sequence in `tokens/s`")
	fs.IntVar(&cfg.Sim.TokenBudget, "sim-token-budget", cfg.Sim.TokenBudget, "simulated engine: most `tokens` one step schedules, prompt chunks and decode tokens together (vLLM's max_num_batched_tokens)")
	fs.IntVar(&cfg.Sim.MaxConcurrent, "sim-max-concurrent", cfg.Sim.MaxConcurrent, "simulated engine: sequences running at once")
	fs.IntVar(&cfg.Sim.MaxQueue, "sim-max-queue", cfg.Sim.MaxQueue, "simulated engine: requests waiting before 429")
	fs.StringVar(&cfg.Sim.Tokenizer, "sim-tokenizer", cfg.Sim.Tokenizer, "simulated engine's tokenizer `spec`: cl100k_base, bytes or hf:DIR (a model's tokenizer.json directory)")
	fs.StringVar(&cfg.Sim.KVEvents, "sim-kv-events", cfg.Sim.KVEvents, "simulated engine: publish its cache changes as vLLM KV events, binding this PUB `endpoint` (tcp://HOST:PORT)")
	fs.StringVar(&cfg.Sim.KVEventsReplay, "sim-kv-events-replay", cfg.Sim.KVEventsReplay, "simulated engine: serve KV-event replay, binding this ROUTER `endpoint`")
	fs.StringVar(&cfg.Sim.KVEventsLayout, "sim-kv-events-layout", cfg.Sim.KVEventsLayout, "simulated engine: KV-event `layout`, map (vLLM >= 0.26) or array")
	fs.StringVar(&cfg.Sim.KVEventsHashes, "sim-kv-events-hashes", cfg.Sim.KVEventsHashes, "simulated engine: block hashes as int or bytes")
	fs.StringVar(&cfg.Sim.KVEventsTopic, "sim-kv-events-topic", cfg.Sim.KVEventsTopic, "simulated engine: KV-event `topic`")
	fs.BoolVar(&cfg.Sim.KVEventsReplayTopic, "sim-kv-events-replay-topic", cfg.Sim.KVEventsReplayTopic, "simulated engine: replay replies carry the topic frame (vLLM >= 0.26)")
	fs.Uint64Var(&cfg.Sim.KVEventsFirstSeq, "sim-kv-events-first-seq", cfg.Sim.KVEventsFirstSeq, "simulated engine: the first KV-event sequence `number` (vLLM: 0; some emulators: 1)")
	fs.BoolVar(&cfg.Sim.KVEventsParentZero, "sim-kv-events-parent-zero", cfg.Sim.KVEventsParentZero, "simulated engine: spell a first block's missing parent as 0 instead of nil")
	fs.IntVar(&cfg.Sim.CPUBlocks, "sim-cpu-blocks", cfg.Sim.CPUBlocks, "simulated engine: CPU KV tier size in GPU-sized `blocks`, filled by GPU evictions (0: no CPU tier)")
	fs.Float64Var(&cfg.Sim.CPULoadTokensPerSec, "sim-cpu-load-tokens-per-s", cfg.Sim.CPULoadTokensPerSec, "simulated engine: rate in `tokens/s` at which CPU-tier hits are loaded back into the GPU")
	fs.IntVar(&cfg.Sim.CPUChunkBlocks, "sim-cpu-chunk-blocks", cfg.Sim.CPUChunkBlocks, "simulated engine: GPU `blocks` per CPU block (vLLM's offloaded block_size / block_size)")
	fs.StringVar(&cfg.Sim.KVSideChannel, "sim-kv-side-channel", cfg.Sim.KVSideChannel, "simulated engine: `host:port` other engines pull KV from (prefill legs' blocks, peer pulls); empty: no KV connector")
	fs.StringVar(&cfg.Sim.KVSideChannelHost, "sim-kv-side-channel-host", cfg.Sim.KVSideChannelHost, "simulated engine: the `host` advertised as remote_host (default: the side channel's bound host)")
	fs.DurationVar(&cfg.Sim.KVLease, "sim-kv-lease", cfg.Sim.KVLease, "simulated engine: how long a prefill leg's blocks stay pinned for a decode engine (vLLM's kv_lease_duration)")
	fs.Float64Var(&cfg.Sim.KVTransferTokensPerSec, "sim-kv-transfer-tokens-per-s", cfg.Sim.KVTransferTokensPerSec, "simulated engine: rate in `tokens/s` at which KV pulled from another engine arrives")
	fs.StringVar(&cfg.Sim.KVLoadFailurePolicy, "sim-kv-load-failure-policy", cfg.Sim.KVLoadFailurePolicy, "simulated engine: a decode leg whose pull fails recomputes or fails (vLLM's kv_load_failure_policy)")
	fs.IntVar(&cfg.Sim.KVRecomputeThreshold, "sim-kv-recompute-threshold", cfg.Sim.KVRecomputeThreshold, "simulated engine: a decode leg pulling fewer `tokens` recomputes them (vLLM's kv_recompute_threshold; 0: always pull)")
	cfg.Gossip.Register(fs)
	return fs
}

// parseConfig parses args (and the file named by --config, see internal/flagfile) over
// DefaultConfig and validates the result. Usage and flag errors go to output; flag.ErrHelp is
// returned for -h/--help.
func parseConfig(args []string, output io.Writer) (Config, error) {
	cfg := DefaultConfig()
	fs := newFlagSet(&cfg, output)
	if err := flagfile.Parse(fs, args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("%w: unexpected arguments %q", errConfig, fs.Args())
	}
	if mirrored(cfg.Engine) && !flagSet(fs, "model") {
		cfg.Model = "" // ask the engine (GET /v1/models)
	}
	if err := refuseIgnored(fs, cfg.Engine); err != nil {
		return Config{}, err
	}
	if flagSet(fs, "sglang-bootstrap-port") && cfg.KVConnector != "sglang" {
		// Only SGLang's connector has a bootstrap server; a port given for another is a
		// misconfiguration the operator believes is in force.
		return Config{}, fmt.Errorf("%w: --sglang-bootstrap-port: only --kv-connector=sglang uses it (given: %q)", errConfig, cfg.KVConnector)
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// refuseIgnored rejects flags the engine mode would silently ignore, saying why: a setting
// that does nothing is a misconfiguration the operator believes is in force.
func refuseIgnored(fs *flag.FlagSet, engine string) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", errConfig, fmt.Sprintf(format, args...))
	}
	if !mirrored(engine) {
		for _, f := range []string{"kv-events", "kv-events-listen", "kv-events-replay", "kv-events-topic", "dp-size", "state-dir", "unremoved-tier-ttl"} {
			if flagSet(fs, f) {
				return bad("--%s: only --engine=vllm|sglang mirrors an engine's KV events; --engine=%s would ignore it (the simulated engine publishes with --sim-kv-events*)", f, engine)
			}
		}
		return nil
	}
	if flagSet(fs, "kv-blocks") {
		return bad("--kv-blocks: the simulated engine's pool size; --engine=%s mirrors an engine that sizes its own KV cache", engine)
	}
	if flagSet(fs, "kv-events") && flagSet(fs, "kv-events-listen") {
		return bad("--kv-events and --kv-events-listen: give one; the agent either dials the engine's PUB socket or binds one the engine dials")
	}
	return nil
}

// flagSet reports whether the flag was given (on the command line or in the flag file).
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// kvEventsConfig maps the --kv-events* flags to the follower's configuration.
func (c Config) kvEventsConfig() kvevents.Config {
	k := kvevents.DefaultConfig()
	k.Endpoint, k.Replay, k.Topic, k.DPSize = c.KVEvents, c.KVEventsReplay, c.KVEventsTopic, c.DPSize
	k.UnremovedTierTTL = c.UnremovedTierTTL
	if c.KVEventsListen != "" {
		k.Endpoint, k.Listen = c.KVEventsListen, true
	}
	return k
}

// serving is the role and connector the node gossips (Validate accepted their names) and the
// bootstrap port, which only SGLang's connector has (0 otherwise, so routers show no meaningless
// port).
func (c Config) serving() (cluster.ServingRole, cluster.KVConnector, uint16) {
	role, _ := cluster.ParseServingRole(c.Role)
	conn, _ := cluster.ParseKVConnector(c.KVConnector)
	var port uint16
	if conn == cluster.KVConnectorSGLang {
		port = uint16(c.SGLangBootstrapPort)
	}
	return role, conn, port
}

// drainNotice is DrainNotice within its share of the drain: at most half of DrainTimeout.
func (c Config) drainNotice() time.Duration { return min(c.DrainNotice, c.DrainTimeout/2) }
