package routerd

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/prefixmesh/prefixmesh/cluster"
	"github.com/prefixmesh/prefixmesh/internal/exposure"
	"github.com/prefixmesh/prefixmesh/internal/flagfile"
	"github.com/prefixmesh/prefixmesh/internal/tokenizer"
	"github.com/prefixmesh/prefixmesh/internal/tracing"
	"github.com/prefixmesh/prefixmesh/local"
	"github.com/prefixmesh/prefixmesh/router/flow"
	"github.com/prefixmesh/prefixmesh/router/frontdoor"
	"github.com/prefixmesh/prefixmesh/router/requests"
	"github.com/prefixmesh/prefixmesh/routing"
)

// ServeConfig is `prefixmesh-router serve`'s configuration; every field maps 1:1 to a flag.
type ServeConfig struct {
	// GRPCListen serves Router, Pins (whose writes change every router's placement),
	// grpc.health.v1 and reflection. Default 127.0.0.1:7080 (7080 sits beside the node agent's
	// 7070). Every listener follows internal/exposure's rule (listeners): off loopback, no
	// plaintext without its --insecure-* flag, no TLS without a client CA unless its
	// no-client-auth flag says so.
	GRPCListen string
	// InsecureGRPC allows plaintext gRPC on a non-loopback address (never in production): the
	// router then warns at start and on /healthz, and sets prefixmesh_router_grpc_plaintext.
	InsecureGRPC bool
	// InsecureRaft allows the Raft transport in plaintext on a non-loopback --raft-listen (never
	// in production: anyone reaching it could forge pin-store log entries).
	InsecureRaft bool
	// TLSNoClientAuth allows --tls-cert without --tls-client-ca on a non-loopback gRPC or Raft
	// address: servers authenticated, clients not (anyone reaching the port may write pins).
	TLSNoClientAuth bool
	// MetricsListen, when set, serves /metrics on its own listener (and not on HTTPListen), so
	// that a NetworkPolicy can open the OpenAI port to clients and the metrics port only to
	// Prometheus. Default "": /metrics beside the front door, under the front door's protection.
	MetricsListen string
	// MetricsTLSCert and MetricsTLSKey serve --metrics-listen over HTTPS; MetricsTLSClientCA
	// also requires Prometheus's client certificate. InsecureMetrics allows plaintext off
	// loopback and MetricsTLSNoClientAuth TLS without client certificates: metrics change
	// nothing, but they show every node's load and cache figures.
	MetricsTLSCert, MetricsTLSKey, MetricsTLSClientCA string
	InsecureMetrics, MetricsTLSNoClientAuth           bool
	// GRPCAdvertise is the gRPC address put in gossip metadata; default: the bound address.
	GRPCAdvertise string
	// HTTPListen serves the OpenAI-compatible front door, /metrics and /healthz. Default
	// 127.0.0.1:8081 (8080 is the node's engine): loopback, like every other default, so that a
	// bare start opens nothing to the network; off loopback the rule asks for --http-tls-* or
	// --insecure-http.
	HTTPListen string
	// InsecureHTTP allows the front door in plaintext on a non-loopback address: the usual
	// setting behind an ingress or gateway that terminates TLS and authenticates users on the
	// cluster network (the chart passes it), never on a network clients share with strangers.
	InsecureHTTP bool
	// ExtProc configures the inference gateway endpoint picker (serve_extproc.go).
	ExtProc ExtProcConfig
	// NodeID names this router in gossip and Raft. Default: the hostname (the pod name under
	// Kubernetes, stable across restarts in a StatefulSet, as a Raft server id must be).
	NodeID string
	// Policy is the routing policy of both the front door and Route: prefixmesh, the expected
	// time to first token under a bounded-load guard (routing/POLICIES.md).
	Policy string
	// LoadFactor is the bounded-load guard's c: 1.25, routing.DefaultPolicyConfig's (Mirrokni
	// et al. 2016).
	LoadFactor float64
	// MissPenalty and MinLoadBound are prefixmesh's other policy knobs, the same names as in
	// `prefixmesh-router sim` and the Helm chart so that a setting tuned in the simulator can be
	// deployed: the extra weight of uncached prefill tokens in its cost (10) and the floor of
	// the bounded-load guard's per-node capacity in requests (8). routing.PolicyConfig says why
	// each default.
	MissPenalty  float64
	MinLoadBound int
	// TierLoadCost is the load cost of a token on each lower tier as a fraction of prefilling
	// it, the prior before a node's own is learned (routing.PolicyConfig.TierLoadCost):
	// "cpu=0.0667,disk=0.85,storage=0.85,remote=1.4" by default; a tier at 1 or more earns no
	// credit.
	TierLoadCost string
	// Disaggregate is when a request's prefill runs on a prefill node (--role prefill agents):
	// auto (default: when it reaches the first token sooner), always or never.
	Disaggregate string
	// PeerPull lets a request go to a node that pulls its prefix's KV from a busier peer that
	// holds it, when that reaches the first token sooner (routing.PolicyConfig.PeerPull): on by
	// default; a source must gossip where its KV is pulled (the agent's --kv-peer-addr).
	PeerPull bool
	// DecodeStall weighs, in the P/D decision, what a prefill costs the other requests on the
	// node that runs it (routing.PolicyConfig.DecodeStall): 2 by default, 0 compares first tokens
	// alone.
	DecodeStall float64
	// Tokenizer tokenises text prompts: cl100k_base (the simulated engine's), bytes, engine
	// (ask a node's engine; the front door only) or none (token ids only).
	Tokenizer string
	// MaxInFlight bounds the front door's concurrent requests (429 beyond): 4096, see
	// requests.Config.MaxInFlight.
	MaxInFlight int
	// MaxBodyBufferBytes caps the request body bytes the front door holds across requests
	// (429 beyond): 512 MiB, see requests.DefaultMaxBodyBufferBytes.
	MaxBodyBufferBytes int64
	// BodyTimeout, FirstByteFloor, FirstByteCeiling and StreamIdleTimeout are the front door's
	// deadlines (frontdoor.Config, where each default says why): 10 s, 2 s, 1 min, 1 min.
	BodyTimeout, FirstByteFloor, FirstByteCeiling, StreamIdleTimeout time.Duration
	// Flow control (router/flow), off unless FlowControl: with it, every door queues requests
	// while the fleet serving their model is saturated, by priority class and tenant, and sheds
	// with 429 beyond the bounds. Off by default because it changes who is refused under
	// overload; the thresholds' and bounds' defaults (flow.DefaultConfig) say why each.
	FlowControl bool
	// PriorityDefault is each model's class for requests that name none: "model=class,...".
	PriorityDefault string
	// FlowQueueThreshold, FlowKVThreshold and FlowStaleAfter say when a node is saturated
	// (flow.Thresholds): 5 waiting requests, 0.8 KV utilisation, a load report 1 s old.
	FlowQueueThreshold, FlowKVThreshold float64
	FlowStaleAfter                      time.Duration
	// FlowMaxQueued bounds the queue over all classes (1,024); FlowClassQueued each class
	// ("critical=1024,standard=1024,sheddable=256"); FlowMaxWait each class's longest wait
	// ("critical=1m0s,standard=30s,sheddable=10s").
	FlowMaxQueued                int
	FlowClassQueued, FlowMaxWait string
	// CORSOrigins, comma-separated ("*" for any), makes the front door answer browsers from
	// these origins; empty (default): no CORS headers.
	CORSOrigins string
	// IndexMaxBytes bounds the summary index's hash tables (routing.IndexConfig.MaxBytes): 256
	// MiB, above the ~115 MiB that 64 nodes × 128k blocks take (14.1 bytes per (block, node)
	// pair measured, BenchmarkIndexBytesPerPair; 16.4 with every block also on a CPU tier), so
	// a default fleet never reaches it and a larger one degrades as defined:
	// adds beyond it are refused and counted (the prefixmesh_index_refused_adds gauge), estimates
	// under-report, and no estimate claims a block a node does not hold. 0: only the pair bound.
	IndexMaxBytes int64

	// TLSCert and TLSKey are this router's identity inside the cluster (PEM files): the gRPC
	// server and the Raft transport serve with them, and they are the client certificate when
	// the router dials nodes (summary repair) and other routers (write forwarding, Raft).
	// Empty: plaintext.
	TLSCert, TLSKey string
	// TLSClientCA is the cluster CA: set, the gRPC server and Raft require client certificates
	// it signed (mTLS), and outbound connections verify servers against it.
	TLSClientCA string
	// TLSServerName, when set, is the name every cluster member's certificate carries: peers
	// are verified against it rather than the address they are dialled at (members are dialled
	// by pod IP, which certificates rarely name).
	TLSServerName string
	// HTTPTLSCert and HTTPTLSKey make the front door speak HTTPS; HTTPTLSClientCA also requires
	// client certificates. Separate from --tls-*: OpenAI clients and Prometheus are outside the
	// cluster's mTLS.
	HTTPTLSCert, HTTPTLSKey, HTTPTLSClientCA string
	// HTTPTLSNoClientAuth allows HTTPS without client certificates on a non-loopback front door:
	// OpenAI SDKs rarely carry client certificates, and user authentication belongs to the
	// gateway in front (SECURITY.md), so this is the front door's common production setting;
	// it stays an explicit flag so that the choice is visible.
	HTTPTLSNoClientAuth bool
	// UpstreamTLSCA verifies https:// engines (default: the system roots); UpstreamTLSCert and
	// UpstreamTLSKey are the router's client certificate toward engines that require mTLS.
	UpstreamTLSCA, UpstreamTLSCert, UpstreamTLSKey string

	// RaftListen is the pin store's Raft transport: 127.0.0.1:7000 by default (loopback: a
	// single router needs no peers; Helm sets :7000). "" runs no pin store: the router follows
	// the pin table of a voter router found in gossip.
	RaftListen string
	// RaftAdvertise is the Raft address other routers dial; default: the listen address (an
	// unspecified host is replaced by the gossip advertise host or the first private address).
	RaftAdvertise string
	// RaftDir holds the Raft log and snapshots: $XDG_STATE_HOME/prefixmesh/<node id>/raft
	// (~/.local/state when unset), outside any checkout the router is started from (Helm: the
	// StatefulSet's volume).
	RaftDir string
	// RaftBootstrapExpect is how many voter routers form a new pin cluster: 1 (default)
	// bootstraps a one-voter cluster at once; N > 1 waits until gossip shows N voter routers,
	// and the one whose node id sorts first bootstraps while the others wait for its leader to
	// add them; 0 never bootstraps. Ignored when RaftDir already holds state.
	RaftBootstrapExpect int
	// RaftVoter runs a Raft member (default true). False: no local store; the router follows
	// the pin table from a voter router, like node agents do.
	RaftVoter bool

	// LogLevel is debug, info (default), warn or error.
	LogLevel string
	// DrainTimeout bounds a graceful shutdown: 20 s, under Kubernetes' default 30 s grace period.
	DrainTimeout time.Duration
	// SyncTimeout bounds how long health stays NOT_SERVING waiting for every known node's first
	// summary: 30 s, so that one node whose NodeCache is unreachable cannot keep a whole router
	// out of service (the unsynced nodes are logged and left out of routing until they sync).
	// 0 waits forever.
	SyncTimeout time.Duration
	// AddrFile, when set, receives "grpc=… http=… gossip=… raft=…" once listening (for port 0).
	AddrFile string
	// ValidateOnly parses and validates, prints "ok" and exits.
	ValidateOnly bool
	// Gossip are the --gossip-*, --join and --insecure-gossip flags shared with the node agent.
	Gossip cluster.Flags
}

// DefaultServeConfig returns the defaults documented on ServeConfig.
func DefaultServeConfig() ServeConfig {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "prefixmesh-router"
	}
	return ServeConfig{
		GRPCListen:          "127.0.0.1:7080",
		HTTPListen:          "127.0.0.1:8081",
		NodeID:              host,
		Policy:              routing.PolicyPrefixMesh,
		LoadFactor:          routing.DefaultPolicyConfig().LoadFactor,
		MissPenalty:         routing.DefaultPolicyConfig().MissPenalty,
		MinLoadBound:        routing.DefaultPolicyConfig().MinLoadBound,
		TierLoadCost:        routing.FormatTierCosts(routing.DefaultPolicyConfig().TierLoadCost),
		Disaggregate:        routing.DisaggAuto.String(),
		PeerPull:            routing.DefaultPolicyConfig().PeerPull,
		DecodeStall:         routing.DefaultPolicyConfig().DecodeStall,
		Tokenizer:           tokenizer.CL100kBase,
		MaxInFlight:         requests.DefaultConfig().MaxInFlight,
		MaxBodyBufferBytes:  requests.DefaultConfig().MaxBodyBufferBytes,
		BodyTimeout:         frontdoor.DefaultConfig().BodyTimeout,
		FirstByteFloor:      frontdoor.DefaultConfig().FirstByteFloor,
		FirstByteCeiling:    frontdoor.DefaultConfig().FirstByteCeiling,
		StreamIdleTimeout:   frontdoor.DefaultConfig().StreamIdleTimeout,
		IndexMaxBytes:       256 << 20,
		FlowQueueThreshold:  flow.DefaultThresholds().QueueDepth,
		FlowKVThreshold:     flow.DefaultThresholds().KVUtil,
		FlowStaleAfter:      flow.DefaultThresholds().StaleAfter,
		FlowMaxQueued:       flow.DefaultLimits().MaxTotal,
		FlowClassQueued:     flow.FormatClassInts(flow.DefaultLimits().MaxQueued),
		FlowMaxWait:         flow.FormatClassDurations(flow.DefaultLimits().MaxWait),
		RaftListen:          "127.0.0.1:7000",
		RaftDir:             defaultRaftDir(host),
		RaftBootstrapExpect: 1,
		RaftVoter:           true,
		LogLevel:            "info",
		DrainTimeout:        20 * time.Second,
		SyncTimeout:         30 * time.Second,
		Gossip:              cluster.DefaultFlags(),
	}
}

var errServeConfig = errors.New("invalid configuration")

// flowConfig is the flow control configuration the flags describe.
func (c ServeConfig) flowConfig() (flow.Config, error) {
	fc := flow.DefaultConfig()
	switch {
	case !(c.FlowQueueThreshold > 0):
		return fc, fmt.Errorf("--flow-queue-threshold %v: must be positive", c.FlowQueueThreshold)
	case !(c.FlowKVThreshold > 0 && c.FlowKVThreshold <= 1):
		return fc, fmt.Errorf("--flow-kv-threshold %v: must be in (0, 1]", c.FlowKVThreshold)
	case c.FlowStaleAfter <= 0:
		return fc, fmt.Errorf("--flow-stale-after %v: must be positive", c.FlowStaleAfter)
	case c.FlowMaxQueued < 0:
		return fc, fmt.Errorf("--flow-max-queued %d: must not be negative", c.FlowMaxQueued)
	}
	var err error
	if fc.ModelClasses, err = flow.ParseModelClasses(c.PriorityDefault); err != nil {
		return fc, fmt.Errorf("--priority-default: %w", err)
	}
	fc.Thresholds = flow.Thresholds{QueueDepth: c.FlowQueueThreshold, KVUtil: c.FlowKVThreshold, StaleAfter: c.FlowStaleAfter}
	fc.Limits.MaxTotal = c.FlowMaxQueued
	if err := flow.ParseClassInts(c.FlowClassQueued, &fc.Limits.MaxQueued); err != nil {
		return fc, fmt.Errorf("--flow-class-queued: %w", err)
	}
	if err := flow.ParseClassDurations(c.FlowMaxWait, &fc.Limits.MaxWait); err != nil {
		return fc, fmt.Errorf("--flow-max-wait: %w", err)
	}
	return fc, fc.Validate()
}

// defaultRaftDir is the Raft directory of a router named nodeID: under the user's state
// directory (XDG Base Directory: $XDG_STATE_HOME, else ~/.local/state), one per node id so two
// routers on one host never share a log.
func defaultRaftDir(nodeID string) string {
	base := os.Getenv("XDG_STATE_HOME")
	if base == "" {
		if home, err := os.UserHomeDir(); err == nil {
			base = filepath.Join(home, ".local", "state")
		} else {
			base = os.TempDir()
		}
	}
	return filepath.Join(base, "prefixmesh", nodeID, "raft")
}

// plaintextGRPC reports whether gRPC serves without TLS on an address other hosts can reach.
func (c ServeConfig) plaintextGRPC() bool {
	return c.TLSCert == "" && !isLoopbackListen(c.GRPCListen)
}

// isLoopbackListen reports whether a host:port listen address binds only loopback.
func isLoopbackListen(addr string) bool { return exposure.IsLoopback(addr) }

// listeners are the router's TCP listeners as internal/exposure's rule sees them, in the order
// they are logged. Gossip is not among them: its key (--gossip-key-file) is its own rule.
func (c ServeConfig) listeners() []exposure.Listener {
	cluster := func(name, flag, addr, insecureFlag string, insecure bool, exposes string) exposure.Listener {
		return exposure.Listener{Name: name, ListenFlag: flag, Addr: addr,
			Cert: c.TLSCert != "", CertFlag: "--tls-cert", ClientCA: c.TLSClientCA != "", ClientCAFlag: "--tls-client-ca",
			Insecure: insecure, InsecureFlag: insecureFlag, NoClientAuth: c.TLSNoClientAuth, NoClientAuthFlag: "--tls-no-client-auth",
			Exposes: exposes}
	}
	ls := []exposure.Listener{cluster("gRPC (Router, Pins)", "--grpc-listen", c.GRPCListen, "--insecure-grpc", c.InsecureGRPC,
		"write pins, which steer every router's placement, and reach the Raft leader")}
	if c.raftEnabled() {
		ls = append(ls, cluster("Raft (pin store)", "--raft-listen", c.RaftListen, "--insecure-raft", c.InsecureRaft,
			"forge pin-store log entries or take part in elections"))
	}
	front := "send completions through the fleet and read prompts and answers in transit"
	if c.MetricsListen == "" {
		front += ", and read /metrics"
	}
	ls = append(ls, exposure.Listener{Name: "HTTP front door", ListenFlag: "--http-listen", Addr: c.HTTPListen,
		Cert: c.HTTPTLSCert != "", CertFlag: "--http-tls-cert", ClientCA: c.HTTPTLSClientCA != "", ClientCAFlag: "--http-tls-client-ca",
		Insecure: c.InsecureHTTP, InsecureFlag: "--insecure-http", NoClientAuth: c.HTTPTLSNoClientAuth, NoClientAuthFlag: "--http-tls-no-client-auth",
		Exposes: front})
	if c.MetricsListen != "" {
		ls = append(ls, exposure.Listener{Name: "metrics", ListenFlag: "--metrics-listen", Addr: c.MetricsListen,
			Cert: c.MetricsTLSCert != "", CertFlag: "--metrics-tls-cert", ClientCA: c.MetricsTLSClientCA != "", ClientCAFlag: "--metrics-tls-client-ca",
			Insecure: c.InsecureMetrics, InsecureFlag: "--insecure-metrics", NoClientAuth: c.MetricsTLSNoClientAuth, NoClientAuthFlag: "--metrics-tls-no-client-auth",
			Exposes: "read every node's load and cache figures"})
	}
	if e := c.ExtProc; e.Listen != "" {
		ls = append(ls, exposure.Listener{Name: "endpoint picker (ext_proc)", ListenFlag: "--ext-proc-listen", Addr: e.Listen,
			Cert: e.TLSCert != "" || e.SelfSigned, CertFlag: "--ext-proc-tls-cert", ClientCA: e.TLSClientCA != "", ClientCAFlag: "--ext-proc-tls-client-ca",
			Insecure: e.Insecure, InsecureFlag: "--insecure-ext-proc", NoClientAuth: e.NoClientAuth, NoClientAuthFlag: "--ext-proc-tls-no-client-auth",
			Exposes: "choose the engine of every request the gateway asks about and read its prompt"})
	}
	return ls
}

// raftEnabled reports whether this router runs a pin-store member.
func (c ServeConfig) raftEnabled() bool { return c.RaftListen != "" && c.RaftVoter }

// policyConfig is the routing policy configuration the flags describe.
func (c ServeConfig) policyConfig() routing.PolicyConfig {
	pc := routing.DefaultPolicyConfig()
	pc.LoadFactor = c.LoadFactor
	pc.MissPenalty = c.MissPenalty
	pc.MinLoadBound = c.MinLoadBound
	_ = routing.ParseTierCosts(c.TierLoadCost, &pc.TierLoadCost) // Validate refuses a bad value
	pc.PeerPull, pc.DecodeStall = c.PeerPull, c.DecodeStall
	return pc
}

// Validate reports the first invalid field, named by its flag. It reads no files except to
// check that the TLS files exist.
func (c ServeConfig) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", errServeConfig, fmt.Sprintf(format, args...))
	}
	for _, f := range []struct{ flag, addr string }{{"--grpc-listen", c.GRPCListen}, {"--http-listen", c.HTTPListen}} {
		if !strings.Contains(f.addr, ":") {
			return bad("%s %q: want host:port", f.flag, f.addr)
		}
	}
	if err := c.validateExtProc(); err != nil {
		return err
	}
	if c.MetricsListen != "" && !strings.Contains(c.MetricsListen, ":") {
		return bad("--metrics-listen %q: want host:port", c.MetricsListen)
	}
	if c.MetricsListen == "" && (c.MetricsTLSCert != "" || c.InsecureMetrics || c.MetricsTLSNoClientAuth) {
		// /metrics beside the front door is the front door's listener, under --http-tls-*.
		return bad("--metrics-tls-*, --insecure-metrics: need --metrics-listen (without it /metrics is served on --http-listen, under its flags)")
	}
	if _, err := exposure.CheckAll(c.listeners()); err != nil {
		return bad("%v", err)
	}
	if c.NodeID == "" || len(c.NodeID) > cluster.MaxNodeIDBytes {
		return bad("--node-id %q: must be 1 to %d bytes", c.NodeID, cluster.MaxNodeIDBytes)
	}
	if !(c.DecodeStall >= 0) || math.IsInf(c.DecodeStall, 1) {
		return bad("--decode-stall %v: want a finite number >= 0", c.DecodeStall)
	}
	if _, err := routing.ParseDisaggMode(c.Disaggregate); err != nil {
		return bad("--disaggregate %q: want auto, always or never", c.Disaggregate)
	}
	var costs [local.NumTiers]float64
	if err := routing.ParseTierCosts(c.TierLoadCost, &costs); err != nil {
		return bad("--tier-load-cost %q: %v", c.TierLoadCost, err)
	}
	if _, err := routing.NewPolicy(c.Policy, c.policyConfig()); err != nil {
		if !slices.Contains(routing.PolicyNames(), c.Policy) {
			return bad("--policy %q: one of %s", c.Policy, strings.Join(routing.PolicyNames(), ", "))
		}
		pc := c.policyConfig()
		switch {
		case !(pc.MissPenalty >= 0):
			return bad("--miss-penalty %v: must be >= 0", c.MissPenalty)
		case pc.MinLoadBound < 0:
			return bad("--min-load-bound %d: must be >= 0", c.MinLoadBound)
		}
		return bad("--load-factor %v: %v", c.LoadFactor, err)
	}
	switch c.Tokenizer {
	case requests.TokenizerEngine, requests.TokenizerNone:
	default:
		if _, err := tokenizer.New(c.Tokenizer); err != nil {
			return bad("--tokenizer %q: %v (want %s, %s, %sDIR, %sURL, %s or %s)", c.Tokenizer, err, tokenizer.CL100kBase, tokenizer.Bytes,
				tokenizer.HFPrefix, tokenizer.RenderPrefix, requests.TokenizerEngine, requests.TokenizerNone)
		}
	}
	switch {
	case c.BodyTimeout <= 0:
		return bad("--body-timeout %v: must be positive", c.BodyTimeout)
	case c.FirstByteFloor <= 0 || c.FirstByteCeiling < c.FirstByteFloor:
		return bad("--first-byte-timeout-floor %v and --first-byte-timeout-ceiling %v: must be positive, floor ≤ ceiling", c.FirstByteFloor, c.FirstByteCeiling)
	case c.StreamIdleTimeout <= 0:
		return bad("--stream-idle-timeout %v: must be positive", c.StreamIdleTimeout)
	}
	if c.MaxInFlight <= 0 {
		return bad("--max-inflight %d: must be positive", c.MaxInFlight)
	}
	if c.MaxBodyBufferBytes < 2*frontdoor.MaxBodyBytes {
		return bad("--max-body-buffer-bytes %d: must hold twice the %d-byte body cap", c.MaxBodyBufferBytes, frontdoor.MaxBodyBytes)
	}
	if _, err := c.flowConfig(); err != nil {
		return bad("flow control flags: %v", err)
	}
	if c.IndexMaxBytes < 0 {
		return bad("--index-max-bytes %d: must not be negative", c.IndexMaxBytes)
	}
	var l slog.Level
	if err := l.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return bad("--log-level %q: want debug, info, warn or error", c.LogLevel)
	}
	if c.DrainTimeout <= 0 {
		return bad("--drain-timeout %v: must be positive", c.DrainTimeout)
	}
	if c.SyncTimeout < 0 {
		return bad("--sync-timeout %v: must not be negative", c.SyncTimeout)
	}
	if err := c.Gossip.Validate(); err != nil {
		return bad("%v", err)
	}
	if err := c.validateRaft(); err != nil {
		return bad("%v", err)
	}
	return c.validateTLS()
}

func (c ServeConfig) validateRaft() error {
	if c.RaftListen == "" {
		return nil
	}
	_, port, err := net.SplitHostPort(c.RaftListen)
	if err != nil {
		return fmt.Errorf("--raft-listen %q: want host:port: %w", c.RaftListen, err)
	}
	switch {
	case c.RaftDir == "" && c.RaftVoter:
		return errors.New("--raft-dir: must not be empty")
	case c.RaftBootstrapExpect < 0:
		return fmt.Errorf("--raft-bootstrap-expect %d: must not be negative", c.RaftBootstrapExpect)
	case c.RaftBootstrapExpect > 1 && port == "0" && c.RaftAdvertise == "":
		// Peers learn our Raft address from gossip before the store binds: it must be known.
		return fmt.Errorf("--raft-bootstrap-expect %d: needs a fixed --raft-listen port or --raft-advertise", c.RaftBootstrapExpect)
	}
	if c.RaftAdvertise != "" {
		if _, _, err := net.SplitHostPort(c.RaftAdvertise); err != nil {
			return fmt.Errorf("--raft-advertise %q: want host:port: %w", c.RaftAdvertise, err)
		}
	}
	return nil
}

func (c ServeConfig) validateTLS() error {
	pairs := []struct{ cert, key, ca, name string }{
		{c.TLSCert, c.TLSKey, c.TLSClientCA, "--tls"},
		{c.HTTPTLSCert, c.HTTPTLSKey, c.HTTPTLSClientCA, "--http-tls"},
		{c.MetricsTLSCert, c.MetricsTLSKey, c.MetricsTLSClientCA, "--metrics-tls"},
	}
	for _, p := range pairs {
		if (p.cert == "") != (p.key == "") {
			return fmt.Errorf("%w: %s-cert and %s-key: give both or neither", errServeConfig, p.name, p.name)
		}
		if p.ca != "" && p.cert == "" {
			return fmt.Errorf("%w: %s-client-ca: needs %s-cert and %s-key", errServeConfig, p.name, p.name, p.name)
		}
	}
	if (c.UpstreamTLSCert == "") != (c.UpstreamTLSKey == "") {
		return fmt.Errorf("%w: --upstream-tls-cert and --upstream-tls-key: give both or neither", errServeConfig)
	}
	for _, f := range []struct{ flag, path string }{
		{"--tls-cert", c.TLSCert}, {"--tls-key", c.TLSKey}, {"--tls-client-ca", c.TLSClientCA},
		{"--http-tls-cert", c.HTTPTLSCert}, {"--http-tls-key", c.HTTPTLSKey}, {"--http-tls-client-ca", c.HTTPTLSClientCA},
		{"--metrics-tls-cert", c.MetricsTLSCert}, {"--metrics-tls-key", c.MetricsTLSKey}, {"--metrics-tls-client-ca", c.MetricsTLSClientCA},
		{"--upstream-tls-ca", c.UpstreamTLSCA}, {"--upstream-tls-cert", c.UpstreamTLSCert}, {"--upstream-tls-key", c.UpstreamTLSKey},
	} {
		if f.path == "" {
			continue
		}
		if _, err := os.Stat(f.path); err != nil {
			return fmt.Errorf("%w: %s: %v", errServeConfig, f.flag, err)
		}
	}
	return nil
}

func newServeFlagSet(cfg *ServeConfig, output io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("prefixmesh-router serve", flag.ContinueOnError)
	fs.SetOutput(output)
	fs.Usage = func() {
		fmt.Fprintf(output, "Usage: prefixmesh-router [serve] [flags]\n\n"+
			"Joins the gossip cluster, mirrors every node's cache summary, keeps the Raft pin table and\n"+
			"serves the OpenAI-compatible front door (HTTP), Router.Route and Pins (gRPC),\n"+
			"grpc.health.v1 (SERVING once every known node is synced) and reflection.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	fs.StringVar(&cfg.GRPCListen, "grpc-listen", cfg.GRPCListen, "gRPC listen `host:port` (port 0 picks a free port)")
	fs.StringVar(&cfg.GRPCAdvertise, "grpc-advertise", cfg.GRPCAdvertise, "gRPC `host:port` announced in gossip (default: the bound address; a wildcard host is replaced by the gossip advertise host or the first private address)")
	fs.StringVar(&cfg.HTTPListen, "http-listen", cfg.HTTPListen, "HTTP listen `host:port` for the front door, /metrics and /healthz")
	fs.BoolVar(&cfg.InsecureGRPC, "insecure-grpc", cfg.InsecureGRPC, "allow plaintext gRPC on a non-loopback --grpc-listen without --tls-cert (never in production)")
	fs.BoolVar(&cfg.InsecureHTTP, "insecure-http", cfg.InsecureHTTP, "allow the front door in plaintext on a non-loopback --http-listen (behind a gateway or ingress that terminates TLS)")
	fs.BoolVar(&cfg.InsecureRaft, "insecure-raft", cfg.InsecureRaft, "allow the Raft transport in plaintext on a non-loopback --raft-listen without --tls-cert (never in production)")
	fs.BoolVar(&cfg.TLSNoClientAuth, "tls-no-client-auth", cfg.TLSNoClientAuth, "allow --tls-cert without --tls-client-ca on non-loopback gRPC and Raft: TLS without client certificates")
	fs.StringVar(&cfg.MetricsListen, "metrics-listen", cfg.MetricsListen, "serve /metrics on this `host:port` instead of --http-listen")
	fs.BoolVar(&cfg.InsecureMetrics, "insecure-metrics", cfg.InsecureMetrics, "allow /metrics in plaintext on a non-loopback --metrics-listen (limit who reaches it with a NetworkPolicy)")
	fs.StringVar(&cfg.MetricsTLSCert, "metrics-tls-cert", cfg.MetricsTLSCert, "--metrics-listen HTTPS certificate `file` (PEM)")
	fs.StringVar(&cfg.MetricsTLSKey, "metrics-tls-key", cfg.MetricsTLSKey, "--metrics-listen HTTPS private key `file` (PEM)")
	fs.StringVar(&cfg.MetricsTLSClientCA, "metrics-tls-client-ca", cfg.MetricsTLSClientCA, "CA `file` (PEM) for Prometheus's client certificates on --metrics-listen (mTLS)")
	fs.BoolVar(&cfg.MetricsTLSNoClientAuth, "metrics-tls-no-client-auth", cfg.MetricsTLSNoClientAuth, "allow --metrics-tls-cert without --metrics-tls-client-ca on a non-loopback --metrics-listen")
	addExtProcFlags(fs, cfg)
	fs.StringVar(&cfg.NodeID, "node-id", cfg.NodeID, "this router's gossip and Raft `id` (the hostname unless set)")
	fs.StringVar(&cfg.Policy, "policy", cfg.Policy, "routing `policy`: "+strings.Join(routing.PolicyNames(), ", "))
	fs.Float64Var(&cfg.LoadFactor, "load-factor", cfg.LoadFactor, "bounded-load `factor` c: no node above c × the mean load (>= 1)")
	fs.Float64Var(&cfg.MissPenalty, "miss-penalty", cfg.MissPenalty, "extra `weight` of uncached prefill tokens in prefixmesh's cost (as in sim)")
	fs.StringVar(&cfg.Disaggregate, "disaggregate", cfg.Disaggregate, "`when` a request's prefill runs on a prefill node (--role prefill agents): auto (when it reaches the first token sooner), always or never")
	fs.Float64Var(&cfg.DecodeStall, "decode-stall", cfg.DecodeStall, "`weight`, in the P/D decision, of what a prefill costs the other requests on the node that runs it (their stalled decode steps and queue); 0 compares first tokens alone")
	fs.BoolVar(&cfg.PeerPull, "peer-pull", cfg.PeerPull, "let a request go to a node that pulls its prefix's KV from a busier peer holding it, when the first token comes sooner (sources: agents with --kv-peer-addr or a simulated engine's side channel)")
	fs.StringVar(&cfg.TierLoadCost, "tier-load-cost", cfg.TierLoadCost, "each lower tier's `costs` to load a token, as a fraction of prefilling it: the prior before a node's own is learned (cpu=…,disk=…,storage=…,remote=…; 1 or more earns no credit)")
	fs.IntVar(&cfg.MinLoadBound, "min-load-bound", cfg.MinLoadBound, "floor of the bounded-load guard's per-node capacity, in `requests` (as in sim; 0: the pure guard)")
	fs.StringVar(&cfg.Tokenizer, "tokenizer", cfg.Tokenizer, "tokenizer `spec`: cl100k_base, bytes, hf:DIR (a model's tokenizer.json and chat template, exact in Go), render:URL (a vLLM render server), engine (front door only) or none")
	fs.IntVar(&cfg.MaxInFlight, "max-inflight", cfg.MaxInFlight, "front door: `requests` proxied at once before answering 429")
	fs.Int64Var(&cfg.MaxBodyBufferBytes, "max-body-buffer-bytes", cfg.MaxBodyBufferBytes, "front door: request body `bytes` held across requests before answering 429 (at least twice the 8 MiB body cap)")
	fs.DurationVar(&cfg.BodyTimeout, "body-timeout", cfg.BodyTimeout, "front door: longest wait for a request body once admitted (408 beyond)")
	fs.DurationVar(&cfg.FirstByteFloor, "first-byte-timeout-floor", cfg.FirstByteFloor, "front door: least wait for a stream's first byte from the engine (the deadline is 4x the node's expected TTFT, clamped)")
	fs.DurationVar(&cfg.FirstByteCeiling, "first-byte-timeout-ceiling", cfg.FirstByteCeiling, "front door: longest wait for a stream's first byte from the engine before retrying elsewhere")
	fs.DurationVar(&cfg.StreamIdleTimeout, "stream-idle-timeout", cfg.StreamIdleTimeout, "front door: a relayed stream silent this long is cut with an SSE error event")
	fs.BoolVar(&cfg.FlowControl, "flow-control", cfg.FlowControl, "queue requests by priority class and tenant while the fleet is saturated, shed beyond the bounds (all three doors)")
	fs.StringVar(&cfg.PriorityDefault, "priority-default", cfg.PriorityDefault, "flow control: each model's class for requests that name none, `model=class,...` (critical, standard, sheddable)")
	fs.Float64Var(&cfg.FlowQueueThreshold, "flow-queue-threshold", cfg.FlowQueueThreshold, "flow control: waiting `requests` at which a node is saturated")
	fs.Float64Var(&cfg.FlowKVThreshold, "flow-kv-threshold", cfg.FlowKVThreshold, "flow control: KV cache `utilisation` (0-1] at which a node is saturated")
	fs.DurationVar(&cfg.FlowStaleAfter, "flow-stale-after", cfg.FlowStaleAfter, "flow control: a node whose load report is older counts as saturated")
	fs.IntVar(&cfg.FlowMaxQueued, "flow-max-queued", cfg.FlowMaxQueued, "flow control: queued `requests` over all classes; beyond, a lower class is displaced or the request shed")
	fs.StringVar(&cfg.FlowClassQueued, "flow-class-queued", cfg.FlowClassQueued, "flow control: each class's queue bound, `class=n,...`")
	fs.StringVar(&cfg.FlowMaxWait, "flow-max-wait", cfg.FlowMaxWait, "flow control: each class's longest wait in the queue, `class=duration,...`")
	fs.StringVar(&cfg.CORSOrigins, "cors-allow-origins", cfg.CORSOrigins, "front door: comma-separated `origins` answered with CORS headers (\"*\": any; empty: none)")
	fs.Int64Var(&cfg.IndexMaxBytes, "index-max-bytes", cfg.IndexMaxBytes, "summary index memory budget in `bytes`: adds beyond it are refused and counted, estimates under-report (0: no byte bound)")
	fs.StringVar(&cfg.TLSCert, "tls-cert", cfg.TLSCert, "cluster certificate `file` (PEM) for gRPC and Raft, also the client certificate toward nodes and routers")
	fs.StringVar(&cfg.TLSKey, "tls-key", cfg.TLSKey, "cluster private key `file` (PEM)")
	fs.StringVar(&cfg.TLSClientCA, "tls-client-ca", cfg.TLSClientCA, "cluster CA `file` (PEM): require client certificates on gRPC and Raft, verify servers when dialling")
	fs.StringVar(&cfg.TLSServerName, "tls-server-name", cfg.TLSServerName, "verify cluster peers' certificates against this `name` instead of the dialled address")
	fs.StringVar(&cfg.HTTPTLSCert, "http-tls-cert", cfg.HTTPTLSCert, "front door HTTPS certificate `file` (PEM); empty serves plain HTTP")
	fs.StringVar(&cfg.HTTPTLSKey, "http-tls-key", cfg.HTTPTLSKey, "front door HTTPS private key `file` (PEM)")
	fs.StringVar(&cfg.HTTPTLSClientCA, "http-tls-client-ca", cfg.HTTPTLSClientCA, "CA `file` (PEM) for front-door client certificates (mTLS)")
	fs.BoolVar(&cfg.HTTPTLSNoClientAuth, "http-tls-no-client-auth", cfg.HTTPTLSNoClientAuth, "allow --http-tls-cert without --http-tls-client-ca on a non-loopback front door (clients authenticated by the gateway in front, not by certificates)")
	fs.StringVar(&cfg.UpstreamTLSCA, "upstream-tls-ca", cfg.UpstreamTLSCA, "CA `file` (PEM) verifying https:// engines (default: system roots)")
	fs.StringVar(&cfg.UpstreamTLSCert, "upstream-tls-cert", cfg.UpstreamTLSCert, "client certificate `file` (PEM) toward engines")
	fs.StringVar(&cfg.UpstreamTLSKey, "upstream-tls-key", cfg.UpstreamTLSKey, "client private key `file` (PEM) toward engines")
	fs.StringVar(&cfg.RaftListen, "raft-listen", cfg.RaftListen, "pin store Raft listen `host:port` (\"\" runs no pin store and follows a voter router)")
	fs.StringVar(&cfg.RaftAdvertise, "raft-advertise", cfg.RaftAdvertise, "Raft `host:port` other routers dial (default: the listen address)")
	fs.StringVar(&cfg.RaftDir, "raft-dir", cfg.RaftDir, "`directory` of the Raft log and snapshots")
	fs.IntVar(&cfg.RaftBootstrapExpect, "raft-bootstrap-expect", cfg.RaftBootstrapExpect, "voter routers that form a new pin cluster (`n`); the first by node id bootstraps; 0 never bootstraps")
	fs.BoolVar(&cfg.RaftVoter, "raft-voter", cfg.RaftVoter, "run a Raft voter (false: follow a voter router's pin table)")
	fs.StringVar(&cfg.LogLevel, "log-level", cfg.LogLevel, "log `level`: debug, info, warn or error")
	fs.DurationVar(&cfg.DrainTimeout, "drain-timeout", cfg.DrainTimeout, "on SIGTERM, how long to let in-flight calls finish")
	fs.DurationVar(&cfg.SyncTimeout, "sync-timeout", cfg.SyncTimeout, "serve anyway after this long if some known node has not synced yet (0: wait forever)")
	fs.StringVar(&cfg.AddrFile, "addr-file", cfg.AddrFile, "write the bound addresses to this `file` once listening")
	fs.BoolVar(&cfg.ValidateOnly, "validate-only", cfg.ValidateOnly, "parse and validate flags, print \"ok\" and exit")
	cfg.Gossip.Register(fs)
	return fs
}

// parseServeConfig parses args (and --config, see internal/flagfile) over the defaults and
// validates the result; flag.ErrHelp for -h.
func parseServeConfig(args []string, output io.Writer) (ServeConfig, error) {
	cfg := DefaultServeConfig()
	fs := newServeFlagSet(&cfg, output)
	if err := flagfile.Parse(fs, args); err != nil {
		return ServeConfig{}, err
	}
	if fs.NArg() > 0 {
		return ServeConfig{}, fmt.Errorf("%w: unexpected arguments %q", errServeConfig, fs.Args())
	}
	if err := cfg.Validate(); err != nil {
		return ServeConfig{}, err
	}
	// The OpenTelemetry environment too (serve_tracing.go): a typo there fails the start, and
	// --validate-only, instead of turning tracing silently off.
	if _, err := tracing.FromEnv(); err != nil {
		return ServeConfig{}, err
	}
	return cfg, nil
}
