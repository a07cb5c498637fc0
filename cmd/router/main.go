// Command prefixmesh-router is the front-door router of a prefixmesh fleet. With no subcommand
// (or "serve") it joins the cluster, mirrors every node's cache summary and routes requests;
// "sim" replays a trace through the routing policies; "pins" administers adapter pins; "demo"
// runs a whole local cluster with simulated engines. "help" (or -h, --help) lists them all;
// --version prints the binary's version (module version, else the VCS stamp of go build).
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/prefixmesh/prefixmesh/internal/buildinfo"
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
	// status prints what one router sees of the fleet, from its /metrics (status.go).
	"status": runStatus,
}

// summaries are the one-line descriptions `prefixmesh-router help` prints beside each
// subcommand (a subcommand without one is still listed).
var summaries = map[string]string{
	"serve":    "join the cluster, mirror every node's cache summary and route requests (the default)",
	"sim":      "replay a request trace through the routing policies and compare them",
	"pins":     "administer adapter pins and show the Raft members (any router's Pins service)",
	"demo":     "run a whole local cluster with simulated engines and send it traffic",
	"tokenize": "print the token ids the router computes for prompts and chat requests (JSON lines in)",
	"status":   "print what a router sees of the fleet: nodes, state, blocks, load, accuracy, TTFT",
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
	if len(args) == 1 && (args[0] == "version" || args[0] == "-version" || args[0] == "--version") {
		fmt.Fprintf(stdout, "prefixmesh-router %s\n", buildinfo.Version())
		return 0
	}
	if len(args) == 1 && (args[0] == "help" || args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
		usage(stdout)
		return 0
	}
	// No subcommand, or flags first: serve.
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return routerd.Main(ctx, args, stdout, stderr)
	}
	fmt.Fprintf(stderr, "prefixmesh-router: unknown subcommand %q\n\n", args[0])
	usage(stderr)
	return 2
}

// usage lists every registered subcommand.
func usage(w io.Writer) {
	names := make([]string, 0, len(subcommands))
	for name := range subcommands {
		names = append(names, name)
	}
	slices.Sort(names)
	fmt.Fprintf(w, "usage: prefixmesh-router [%s] [flags]\n\nSubcommands:\n", strings.Join(names, "|"))
	for _, name := range names {
		fmt.Fprintf(w, "  %-9s %s\n", name, summaries[name])
	}
	fmt.Fprintf(w, "\nWith no subcommand, or flags first, the router serves. \"prefixmesh-router <subcommand> --help\" shows a subcommand's flags;\n\"prefixmesh-router --version\" prints the version.\n")
}
