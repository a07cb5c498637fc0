package agentd

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/prefixmesh/prefixmesh/cluster"
	"github.com/prefixmesh/prefixmesh/node"
)

// announcer tells routers what the KV-event follower learns about a mirrored engine. An engine
// restart (the follower dropped the mirror) moves the NodeCache server to a new epoch at once,
// so a router's GetSummary repair never pairs the new epoch with the old cache; the gossip agent
// then announces that epoch, and routers drop everything they knew about the old one. While any
// rank's mirror may hold blocks its engine no longer has (Follower.Cold: a restored checkpoint
// whose gap is not settled yet), the node is flagged cold; a partial mirror (a late join, an
// agent restart, a gap beyond replay) is a lower bound of the engine's cache and is credited,
// so it is not cold. The follower's hooks only record and signal (they run on its appliers and
// must not block); run gossips the changes.
type announcer struct {
	srv     *node.Server
	coldFn  func() bool   // the follower's Cold (one source of truth with its gauge)
	changed chan struct{} // capacity 1: coalesces bursts (a restart flips completeness twice)
	log     *slog.Logger
}

func newAnnouncer(srv *node.Server, logger *slog.Logger) *announcer {
	return &announcer{srv: srv, changed: make(chan struct{}, 1), log: logger}
}

// restarted is the follower's OnRestart: the mirror is already clear.
func (a *announcer) restarted(rank int) {
	e := a.srv.NewEpoch()
	a.log.Info("engine restarted: new epoch", "rank", rank, "epoch", fmt.Sprintf("%016x", e))
	a.signal()
}

// completeChanged is the follower's OnComplete.
func (a *announcer) completeChanged(int, bool) { a.signal() }

func (a *announcer) signal() {
	select {
	case a.changed <- struct{}{}:
	default:
	}
}

// cold reports whether the node is to be flagged cold now (never without a mirror: a nil
// announcer).
func (a *announcer) cold() bool { return a != nil && a.coldFn != nil && a.coldFn() }

// start gossips every change through agent until ctx ends; the returned function waits for
// that. With no announcer or no agent (no --gossip-listen) there is nothing to gossip.
func (a *announcer) start(ctx context.Context, agent *cluster.Agent) (wait func()) {
	if a == nil || agent == nil {
		return func() {}
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			a.sync(agent)
			select {
			case <-ctx.Done():
				return
			case <-a.changed:
			}
		}
	})
	return wg.Wait
}

// sync brings the agent's metadata to the server's epoch and the follower's completeness.
func (a *announcer) sync(agent *cluster.Agent) {
	m := agent.Meta()
	if e := a.srv.Epoch(); e != m.Epoch {
		if err := agent.SetEpoch(e); err != nil {
			a.log.Warn("gossip the new epoch", "err", err) // the metadata is set; gossip carries it on
		}
	}
	if cold := a.cold(); cold != m.Cold {
		a.log.Info("kv events mirror", "cold", cold)
		if err := agent.SetCold(cold); err != nil {
			a.log.Warn("gossip the cold flag", "err", err)
		}
	}
}
