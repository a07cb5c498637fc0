// Command prefixmesh-router is the front-door router of a prefixmesh fleet. With no subcommand
// (or "serve") it joins the cluster, mirrors every node's cache summary and routes requests;
// "sim" replays a trace through the routing policies; "pins" administers adapter pins; "demo"
// runs a whole local cluster with simulated engines.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/prefixmesh/prefixmesh/router/routerd"
)

// subcommands maps a name to its entry point; each parses its own flags from args.
var subcommands = map[string]func(ctx context.Context, args []string, stdout, stderr io.Writer) int{
	"serve": routerd.Main,
	"sim":   runSim,
	"pins":  runPins,
	"demo":  runDemo,
	// tokenize prints the ids the router computes for prompts and chat requests (tokenize.go).
	"tokenize": runTokenize,
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// After the first signal, restore default handling: a second Ctrl-C kills a stuck drain.
	context.AfterFunc(ctx, stop)
	code := dispatch(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		if run, ok := subcommands[args[0]]; ok {
			return run(ctx, args[1:], stdout, stderr)
		}
	}
	// No subcommand, or flags first: serve.
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return routerd.Main(ctx, args, stdout, stderr)
	}
	fmt.Fprintf(stderr, "usage: prefixmesh-router [serve|sim|pins|demo|tokenize] [flags]\n")
	return 2
}
