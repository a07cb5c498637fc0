package routerd

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/prefixmesh/prefixmesh/cluster"
	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
)

// servingState is the router's one health verdict: SERVING once the mirror has synced every
// node it knows, and only while gossip is not isolated (cluster.HealthGate, which also says why
// on /healthz). It sets grpc.health.v1 and the HTTP ready flag together.
type servingState struct {
	gate   cluster.HealthGate
	h      *health.Server
	ready  *atomic.Bool
	agent  *cluster.Agent
	logger *slog.Logger
	// onServing, when set before follow starts, hears every change of the verdict (the
	// endpoint picker's readiness follows the router's). Called under mu.
	onServing func(serving bool)

	mu                                    sync.Mutex // guards the fields below
	gossipOK, synced, serving, everServed bool
	applied                               bool // the verdict was set once
}

// follow starts following gossip health; markSynced adds the sync. The returned function waits
// for the watcher once ctx has ended.
func (s *servingState) follow(ctx context.Context) (wait func()) {
	return s.gate.Follow(ctx, s.agent, func(gh cluster.Health) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.gossipOK = gh.OK
		s.applyLocked()
	}, s.logger)
}

// markSynced records that the mirror has synced (serve as soon as it has, not a poll later).
func (s *servingState) markSynced() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.synced = true
	s.applyLocked()
}

func (s *servingState) applyLocked() {
	ok := s.gossipOK && s.synced
	if ok == s.serving && s.applied {
		return
	}
	s.serving, s.applied = ok, true
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ok {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.h.SetServingStatus("", st)
	s.h.SetServingStatus(pb.Router_ServiceDesc.ServiceName, st)
	s.h.SetServingStatus(pb.Directory_ServiceDesc.ServiceName, st) // answers from the same view
	s.ready.Store(ok)
	if s.onServing != nil {
		s.onServing(ok)
	}
	if ok && !s.everServed {
		s.logger.Info("serving", "nodes", len(s.agent.Mirror().Nodes()))
	}
	s.everServed = s.everServed || ok
}
