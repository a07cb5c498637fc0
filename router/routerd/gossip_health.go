package routerd

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/prefixmesh/prefixmesh/cluster"
	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
)

// gossipHealthPoll is how often a serving router re-reads its gossip health: probes come every
// few seconds, and the read is a map walk.
const gossipHealthPoll = 250 * time.Millisecond

// gossipHealth carries the gossip agent's health into grpc.health.v1 and /healthz (issue 15): a
// router given seeds that knows no other member (wrong key or label, seeds down, or every peer
// lost) sees no node, so it reports NOT_SERVING with the reason rather than 200 with nothing to
// route to.
type gossipHealth struct {
	reason atomic.Pointer[string] // why gossip is unhealthy; nil or "" when it is fine
	// onServing, when set before follow starts, hears every change of serving (the endpoint
	// picker's readiness follows the router's).
	onServing func(serving bool)
}

// notServing returns why gossip makes this router not serving, or "".
func (g *gossipHealth) notServing() string {
	if r := g.reason.Load(); r != nil {
		return *r
	}
	return ""
}

// follow sets health and ready until ctx ends: SERVING once synced is closed, while gossip is
// not isolated. The reason of an isolation is reported from the start (also while the router
// waits for its first sync). It runs in the caller's goroutine.
func (g *gossipHealth) follow(ctx context.Context, agent *cluster.Agent, synced <-chan struct{}, h *health.Server, ready *atomic.Bool, logger *slog.Logger) {
	t := time.NewTicker(gossipHealthPoll)
	defer t.Stop()
	var last cluster.Health
	serving, everServed, isSynced := false, false, false
	for first := true; ; first = false {
		gh := agent.Health()
		if first || gh.Reason != last.Reason {
			reason := gh.Reason
			g.reason.Store(&reason)
		}
		// Log transitions only: the reason's text may change with every failed join, which the
		// join loop logs itself (with backoff).
		if !gh.OK && (first || last.OK) {
			logger.Warn("gossip isolated: not serving", "reason", gh.Reason)
		}
		last = gh
		select {
		case <-synced:
			isSynced, synced = true, nil // closed: seen, stop selecting on it
		default:
		}
		if ok := gh.OK && isSynced; ok != serving || first {
			serving = ok
			st := healthpb.HealthCheckResponse_NOT_SERVING
			if ok {
				st = healthpb.HealthCheckResponse_SERVING
			}
			h.SetServingStatus("", st)
			h.SetServingStatus(pb.Router_ServiceDesc.ServiceName, st)
			ready.Store(ok)
			if g.onServing != nil {
				g.onServing(ok)
			}
			switch {
			case ok && !everServed:
				logger.Info("serving", "nodes", len(agent.Mirror().Nodes()), "members", gh.Members)
			case ok:
				logger.Info("serving again: gossip joined", "nodes", gh.Nodes, "members", gh.Members)
			}
			everServed = everServed || ok
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-synced: // serve as soon as the sync completes, not a poll later
		}
	}
}
