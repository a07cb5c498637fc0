// Command prefixmesh-node is the node agent of a prefixmesh fleet (package node/agentd has the
// daemon's life; this is its entry point). On SIGTERM it reports NOT_SERVING, drains within
// --drain-timeout and exits 0; a second signal kills a stuck drain. --version prints the binary's
// version (module version, else the VCS stamp of go build) and exits.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/prefixmesh/prefixmesh/internal/buildinfo"
	"github.com/prefixmesh/prefixmesh/node/agentd"
)

func main() {
	if len(os.Args) == 2 && (os.Args[1] == "--version" || os.Args[1] == "-version") {
		fmt.Printf("prefixmesh-node %s\n", buildinfo.Version())
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	// After the first signal, restore default handling: a second Ctrl-C kills a stuck drain.
	context.AfterFunc(ctx, stop)
	code := agentd.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
