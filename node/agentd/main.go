// Package agentd is the node agent daemon's life, importable so that cmd/node and the one-process
// demo run the same code. It owns the node's prefix cache (a local.RadixTree, the only authority
// on what this node holds) and serves it over gRPC as NodeCache, next to grpc.health.v1 and server
// reflection; its HTTP listener serves /metrics, /healthz and, with --engine=sim (the default), a
// simulated engine speaking the OpenAI API over the same cache. With --gossip-listen it joins the
// cluster and publishes its summary and load to routers. It follows the Raft pin table from a
// router (--pins-addr, or the routers gossip knows) and holds the prefix pins that name this
// node in its cache. When its context ends it reports NOT_SERVING, leaves the cluster, drains
// within --drain-timeout and returns. config.go holds the flags, run.go the lifecycle,
// engine.go the engine wiring, gossip.go the cluster wiring, pins.go the pin follower.
package agentd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
)

// Main parses args and runs the agent until ctx ends. It returns 0 after a clean run (or --help,
// --validate-only), 2 for a bad configuration and 1 when the agent failed.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := parseConfig(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "prefixmesh-node: %v\n", err)
		return 2
	}
	if cfg.ValidateOnly {
		fmt.Fprintln(stdout, "ok")
		return 0
	}
	if err := Run(ctx, cfg, stderr); err != nil {
		fmt.Fprintf(stderr, "prefixmesh-node: %v\n", err)
		return 1
	}
	return 0
}

// agentMain is Main without a context, for tests of flag handling.
func agentMain(args []string, stdout, stderr io.Writer) int {
	return Main(context.Background(), args, stdout, stderr)
}
