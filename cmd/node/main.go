// Command prefixmesh-node is the node agent of a prefixmesh fleet (package node/agentd has the
// daemon's life; this is its entry point). On SIGTERM it reports NOT_SERVING, drains within
// --drain-timeout and exits 0; a second signal kills a stuck drain.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/prefixmesh/prefixmesh/node/agentd"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	// After the first signal, restore default handling: a second Ctrl-C kills a stuck drain.
	context.AfterFunc(ctx, stop)
	code := agentd.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
