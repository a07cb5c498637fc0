package agentd

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixmesh/prefixmesh/cluster"
	"github.com/prefixmesh/prefixmesh/local"
	"github.com/prefixmesh/prefixmesh/node/simengine"
)

// startEngine brings up the node's engine side and returns its closer and, when the engine
// reports one, its load for gossip (nil for an external engine). With --engine=sim it builds
// the simulated engine over the node's tree and mounts its OpenAI API on mux ("/"; /metrics and
// /healthz stay the agent's). With --engine=external the engine is another process that calls
// NodeCache over gRPC; nothing runs here, and --engine-url is what gets advertised.
func startEngine(ctx context.Context, cfg Config, tree *local.RadixTree, logger *slog.Logger, reg *prometheus.Registry, mux *http.ServeMux) (closeEngine func(), load cluster.LoadFunc, err error) {
	switch cfg.Engine {
	case engineExternal:
		logger.Info("external engine", "url", cfg.EngineURL)
		return func() {}, nil, nil
	case engineSim:
		sc := simengine.DefaultConfig()
		sc.BlockSize = cfg.BlockSize
		sc.KVBlocks = cfg.KVBlocks
		sc.Model = cfg.Model
		sc.PrefillTokensPerSec = cfg.Sim.PrefillTokensPerSec
		sc.DecodeTokensPerSec = cfg.Sim.DecodeTokensPerSec
		sc.MaxConcurrent = cfg.Sim.MaxConcurrent
		sc.MaxQueue = cfg.Sim.MaxQueue
		eng, err := simengine.New(sc, tree, logger.With("component", "simengine"), reg)
		if err != nil {
			return nil, nil, fmt.Errorf("simulated engine: %w", err)
		}
		if err := eng.Start(ctx); err != nil {
			return nil, nil, err
		}
		mux.Handle("/", eng.Handler())
		return eng.Close, simLoad(eng), nil
	default:
		return nil, nil, fmt.Errorf("unknown engine %q", cfg.Engine)
	}
}
