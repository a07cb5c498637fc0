// Package shutdown stops a daemon's gRPC and HTTP servers together: both finish their in-flight
// calls in parallel until the context's deadline, then whatever is still open is cut, so a drain
// never outlasts its deadline and never cuts a call it had time for.
package shutdown

import (
	"context"
	"log/slog"
	"net/http"

	"google.golang.org/grpc"
)

// Servers drains g and the HTTP servers hs within ctx, then stops what is left.
func Servers(ctx context.Context, logger *slog.Logger, g *grpc.Server, hs ...*http.Server) {
	grpcDone := make(chan struct{})
	go func() {
		g.GracefulStop()
		close(grpcDone)
	}()
	for _, h := range hs {
		if err := h.Shutdown(ctx); err != nil {
			logger.Warn("http drain incomplete; closing connections", "err", err)
			_ = h.Close()
		}
	}
	select {
	case <-grpcDone:
	case <-ctx.Done():
		logger.Warn("grpc drain incomplete; closing connections")
		g.Stop()
		<-grpcDone
	}
}
