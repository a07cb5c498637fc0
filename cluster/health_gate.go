package cluster

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"
)

// HealthPoll is how often a daemon re-reads its gossip health: Kubernetes probes come every few
// seconds, so a quarter second is fresh enough, and the read is a map walk.
const HealthPoll = 250 * time.Millisecond

// HealthGate carries a gossip agent's health into its daemon's health endpoints (grpc.health.v1,
// /healthz): a member given seeds that knows no other member (a wrong key or label, seeds down,
// every peer lost) is invisible to the cluster, so its daemon reports NOT_SERVING with the
// reason rather than a healthy-looking island. Both daemons use one.
type HealthGate struct {
	reason atomic.Pointer[string] // why gossip is unhealthy; nil or "" when it is fine
}

// NotServing returns why gossip makes the daemon not serving, or "".
func (g *HealthGate) NotServing() string {
	if r := g.reason.Load(); r != nil {
		return *r
	}
	return ""
}

// Follow records agent's health at once, before it returns (so no endpoint says ok before the
// first look), then on every change until ctx ends, calling onChange after each record; the
// returned function waits for the watcher. Transitions are logged once each: the reason's text
// may change with every failed join, which the join loop logs itself with backoff. A nil agent
// (no gossip) is healthy: onChange is called once with OK.
func (g *HealthGate) Follow(ctx context.Context, agent *Agent, onChange func(Health), logger *slog.Logger) (wait func()) {
	if agent == nil {
		onChange(Health{OK: true})
		return func() {}
	}
	now := agent.Health()
	g.record(now)
	onChange(now)
	done := make(chan struct{})
	go func() {
		defer close(done)
		first, wasOK := true, false
		agent.WatchHealth(ctx, HealthPoll, func(h Health) {
			g.record(h)
			onChange(h)
			switch {
			case !h.OK && (first || wasOK):
				logger.Warn("not serving: gossip isolated", "reason", h.Reason)
			case h.OK && !first && !wasOK:
				logger.Info("serving: gossip joined", "members", h.Members, "routers", h.Routers)
			}
			first, wasOK = false, h.OK
		})
	}()
	return func() { <-done }
}

func (g *HealthGate) record(h Health) {
	reason := h.Reason
	g.reason.Store(&reason)
}
