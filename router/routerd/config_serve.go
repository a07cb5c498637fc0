package routerd

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/prefixmesh/prefixmesh/cluster"
	"github.com/prefixmesh/prefixmesh/internal/flagfile"
	"github.com/prefixmesh/prefixmesh/routing"
)

// ServeConfig is `prefixmesh-router serve`'s configuration; every field maps 1:1 to a flag.
type ServeConfig struct {
	// GRPCListen serves Router, grpc.health.v1 and reflection. Default 0.0.0.0:7080: clients are
	// on other hosts, and 7080 sits beside the node agent's 7070.
	GRPCListen string
	// GRPCAdvertise is the gRPC address put in gossip metadata; default: the bound address.
	GRPCAdvertise string
	// HTTPListen serves /metrics and /healthz. Default 0.0.0.0:8081 (8080 is the node's engine).
	HTTPListen string
	// NodeID names this router in gossip. Default: the hostname (the pod name under Kubernetes).
	NodeID string
	// Policy is the routing policy: longest-prefix, the first version's simplest sound rule.
	Policy string
	// Tokenizer tokenises text prompts: cl100k_base; "none" requires token ids.
	Tokenizer string
	// LogLevel is debug, info (default), warn or error.
	LogLevel string
	// DrainTimeout bounds a graceful shutdown: 20 s, under Kubernetes' default 30 s grace period.
	DrainTimeout time.Duration
	// SyncTimeout bounds how long health stays NOT_SERVING waiting for every known node's first
	// summary: 30 s, so that one node whose NodeCache is unreachable cannot keep a whole router
	// out of service (the unsynced nodes are logged and left out of routing until they sync).
	// 0 waits forever.
	SyncTimeout time.Duration
	// AddrFile, when set, receives "grpc=… http=… gossip=…" once listening (for port 0).
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
		GRPCListen:   "0.0.0.0:7080",
		HTTPListen:   "0.0.0.0:8081",
		NodeID:       host,
		Policy:       routing.PolicyLongestPrefix,
		Tokenizer:    "cl100k_base",
		LogLevel:     "info",
		DrainTimeout: 20 * time.Second,
		SyncTimeout:  30 * time.Second,
		Gossip:       cluster.DefaultFlags(),
	}
}

var errServeConfig = errors.New("invalid configuration")

// Validate reports the first invalid field, named by its flag.
func (c ServeConfig) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", errServeConfig, fmt.Sprintf(format, args...))
	}
	for _, f := range []struct{ flag, addr string }{{"--grpc-listen", c.GRPCListen}, {"--http-listen", c.HTTPListen}} {
		if !strings.Contains(f.addr, ":") {
			return bad("%s %q: want host:port", f.flag, f.addr)
		}
	}
	if c.NodeID == "" || len(c.NodeID) > cluster.MaxNodeIDBytes {
		return bad("--node-id %q: must be 1 to %d bytes", c.NodeID, cluster.MaxNodeIDBytes)
	}
	if _, err := routing.NewPolicy(c.Policy, routing.DefaultPolicyConfig()); err != nil {
		return bad("--policy %q: one of %s", c.Policy, strings.Join(routing.PolicyNames(), ", "))
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
	return nil
}

func newServeFlagSet(cfg *ServeConfig, output io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("prefixmesh-router serve", flag.ContinueOnError)
	fs.SetOutput(output)
	fs.Usage = func() {
		fmt.Fprintf(output, "Usage: prefixmesh-router [serve] [flags]\n\n"+
			"Joins the gossip cluster, mirrors every node's cache summary and serves Router.Route\n"+
			"(gRPC), grpc.health.v1 (SERVING once every known node is synced) and reflection.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	fs.StringVar(&cfg.GRPCListen, "grpc-listen", cfg.GRPCListen, "gRPC listen `host:port` (port 0 picks a free port)")
	fs.StringVar(&cfg.GRPCAdvertise, "grpc-advertise", cfg.GRPCAdvertise, "gRPC `host:port` announced in gossip (default: the bound address)")
	fs.StringVar(&cfg.HTTPListen, "http-listen", cfg.HTTPListen, "HTTP listen `host:port` for /metrics and /healthz")
	fs.StringVar(&cfg.NodeID, "node-id", cfg.NodeID, "this router's gossip `id` (the hostname unless set)")
	fs.StringVar(&cfg.Policy, "policy", cfg.Policy, "routing `policy`: "+strings.Join(routing.PolicyNames(), ", "))
	fs.StringVar(&cfg.Tokenizer, "tokenizer", cfg.Tokenizer, "tokenizer `name` for text prompts (cl100k_base, bytes, or none)")
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
	return cfg, nil
}
