package agentd

import (
	"context"
	"log/slog"
	"net"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixmesh/prefixmesh/cluster"
	"github.com/prefixmesh/prefixmesh/local"
	"github.com/prefixmesh/prefixmesh/node/simengine"
)

// startGossip starts the node's cluster agent when --gossip-listen is set (nil, nil otherwise):
// a memberlist member whose metadata names this node, its epoch (the NodeCache server's, so
// that a router's repair pull matches), its gRPC and engine addresses, and that publishes the
// tree's summary journal and the engine's load to every router.
func startGossip(ctx context.Context, cfg Config, tree *local.RadixTree, epoch uint64, grpcAddr, httpAddr net.Addr,
	load cluster.LoadFunc, logger *slog.Logger, reg prometheus.Registerer) (*cluster.Agent, error) {
	if cfg.Gossip.Listen == "" {
		return nil, nil
	}
	gc := cluster.DefaultConfig(cluster.RoleNode, cfg.NodeID)
	if err := cfg.Gossip.Apply(&gc); err != nil {
		return nil, err
	}
	gc.Meta.Epoch = epoch
	gc.Meta.GRPCAddr = reachableAddr(grpcAddr, gc.AdvertiseAddr)
	gc.Meta.EngineURL = cfg.EngineURL
	gc.Meta.Model = cfg.Model
	gc.Meta.BlockSize = uint32(cfg.BlockSize)
	if cfg.Engine == engineSim {
		gc.Meta.KVCapacity = uint64(cfg.KVBlocks)
		if cfg.EngineURL == "" {
			gc.Meta.EngineURL = "http://" + reachableAddr(httpAddr, gc.AdvertiseAddr) // the bound port, not a listen port 0
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

// reachableAddr is the address routers should dial for a listener: its own address unless it
// listens on every interface, then the gossip advertise host (or the first non-loopback
// address). A Unix socket is not reachable from routers: "" (routers cannot repair this node).
func reachableAddr(a net.Addr, advertise string) string {
	tcp, ok := a.(*net.TCPAddr)
	if !ok {
		return ""
	}
	if !tcp.IP.IsUnspecified() {
		return tcp.String()
	}
	return net.JoinHostPort(hostFor(advertise), strconv.Itoa(tcp.Port))
}

func hostFor(advertise string) string {
	if advertise != "" {
		return advertise
	}
	addrs, err := net.InterfaceAddrs()
	if err == nil {
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLoopback() && ipn.IP.To4() != nil {
				return ipn.IP.String()
			}
		}
	}
	return "127.0.0.1"
}
