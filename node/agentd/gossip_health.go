package agentd

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prefixmesh/prefixmesh/cluster"
)

// gossipHealthPoll is how often the agent re-reads its gossip health: a probe period of
// Kubernetes is seconds, so a quarter second is fresh enough and costs nothing.
const gossipHealthPoll = 250 * time.Millisecond

// gossipHealth carries the gossip agent's health into grpc.health.v1 and /healthz (issue 15): a
// node agent given seeds that has not joined, or has lost every peer, is invisible to every
// router, so it reports NOT_SERVING with the reason instead of a healthy-looking island.
type gossipHealth struct {
	reason atomic.Pointer[string] // why gossip is unhealthy; nil or "" when it is fine
}

// notServing returns why gossip makes this node not serving, or "".
func (g *gossipHealth) notServing() string {
	if r := g.reason.Load(); r != nil {
		return *r
	}
	return ""
}

// start records the gossip agent's health and calls apply (the agent's one health verdict) on
// every change: at once, and with gossip, following the agent's health
// until ctx ends; the returned function waits for that. Without gossip the node serves at once.
func (g *gossipHealth) start(ctx context.Context, agent *cluster.Agent, apply func(), logger *slog.Logger) (wait func()) {
	if agent == nil {
		apply()
		return func() {}
	}
	// The first verdict before returning, so /healthz never says ok before the watcher's first look.
	now := agent.Health()
	g.reason.Store(&now.Reason)
	apply()
	done := make(chan struct{})
	go func() {
		defer close(done)
		first, wasOK := true, false
		agent.WatchHealth(ctx, gossipHealthPoll, func(gh cluster.Health) {
			reason := gh.Reason
			g.reason.Store(&reason)
			apply()
			// Log transitions only: the reason's text may change with every failed join, which
			// the join loop logs itself (with backoff).
			switch {
			case !gh.OK && (first || wasOK):
				logger.Warn("not serving: gossip isolated", "reason", gh.Reason)
			case gh.OK && !first && !wasOK:
				logger.Info("serving: gossip joined", "members", gh.Members, "routers", gh.Routers)
			}
			first, wasOK = false, gh.OK
		})
	}()
	return func() { <-done }
}
