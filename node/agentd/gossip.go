package agentd

import (
	"context"
	"log/slog"
	"net"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixmesh/prefixmesh/cluster"
	"github.com/prefixmesh/prefixmesh/node/simengine"
)

// startGossip starts the node's cluster agent when --gossip-listen is set (nil, nil otherwise):
// a memberlist member whose metadata names this node, its epoch (the NodeCache server's, so
// that a router's repair pull matches), whether it starts cold (a mirror without a clean
// baseline yet), its gRPC and engine addresses, its serving role and KV connector, and that publishes the tree's summary journal
// and the engine's load to every router.
func startGossip(ctx context.Context, cfg Config, tree cluster.Source, epoch uint64, cold bool, grpcAddr, httpAddr net.Addr,
	load cluster.LoadFunc, kvPeer string, logger *slog.Logger, reg prometheus.Registerer) (*cluster.Agent, error) {
	if cfg.Gossip.Listen == "" {
		return nil, nil
	}
	gc := cluster.DefaultConfig(cluster.RoleNode, cfg.NodeID)
	if err := cfg.Gossip.Apply(&gc); err != nil {
		return nil, err
	}
	gc.Meta.Epoch, gc.Meta.Cold = epoch, cold
	gc.Meta.GRPCAddr = cluster.ReachableAddr(grpcAddr, gc.AdvertiseAddr)
	gc.Meta.EngineURL = cfg.EngineURL
	gc.Meta.Model = cfg.Model
	gc.Meta.BlockSize = uint32(cfg.BlockSize)
	gc.Meta.Serving, gc.Meta.KVConnector, gc.Meta.BootstrapPort = cfg.serving()
	gc.Meta.KVPeerAddr = cfg.KVPeerAddr
	if gc.Meta.KVPeerAddr == "" {
		gc.Meta.KVPeerAddr = kvPeer
	}
	if cfg.Engine == engineSim {
		gc.Meta.KVCapacity = uint64(cfg.KVBlocks)
		if cfg.EngineURL == "" {
			gc.Meta.EngineURL = "http://" + cluster.ReachableAddr(httpAddr, gc.AdvertiseAddr) // the bound port, not a listen port 0
		}
	}
	gc.Logger = logger.With("component", "gossip")
	gc.Registry = reg
	a, err := cluster.New(gc, cluster.Deps{Source: tree, Load: load})
	if err != nil {
		return nil, err
	}
	if err := a.Start(ctx); err != nil {
		return nil, err
	}
	logger.Info("gossip started", "addr", a.GossipAddr(), "join", cfg.Gossip.Join, "grpc_advertised", gc.Meta.GRPCAddr)
	return a, nil
}

// simLoad adapts the simulated engine's load report.
func simLoad(e *simengine.Engine) cluster.LoadFunc {
	return func() cluster.Load {
		l := e.Load()
		return cluster.Load{
			Running:             uint32(max(l.Running, 0)),
			Waiting:             uint32(max(l.Waiting, 0)),
			FreeBlocks:          uint64(max(l.FreeBlocks, 0)),
			QueuedPrefillTokens: uint64(max(l.QueuedPrefillTokens, 0)),
		}
	}
}
