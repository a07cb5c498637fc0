// Command prefixmesh-node is the node agent of a prefixmesh fleet. It owns the node's prefix
// cache (a local.RadixTree, the only authority on what this node holds) and serves it over gRPC
// as NodeCache, next to grpc.health.v1 and server reflection; its HTTP listener serves /metrics,
// /healthz and, with --engine=sim (the default), a simulated engine speaking the OpenAI API over
// the same cache. On SIGTERM it reports NOT_SERVING, drains within --drain-timeout and exits 0.
// config.go holds the flags, run.go the lifecycle, engine.go the engine wiring.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	os.Exit(agentMain(os.Args[1:], os.Stdout, os.Stderr))
}

// agentMain is the one exit point: it returns 0 after a clean run (or --help, --validate-only), 2
// for a bad configuration and 1 when the agent failed.
func agentMain(args []string, stdout, stderr io.Writer) int {
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
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	// After the first signal, restore default handling: a second Ctrl-C kills a stuck drain.
	context.AfterFunc(ctx, stop)
	if err := run(ctx, cfg, stderr); err != nil {
		fmt.Fprintf(stderr, "prefixmesh-node: %v\n", err)
		return 1
	}
	return 0
}
