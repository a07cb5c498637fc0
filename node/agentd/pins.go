package agentd

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/prefixmesh/prefixmesh/cluster"
	"github.com/prefixmesh/prefixmesh/cluster/pins"
	"github.com/prefixmesh/prefixmesh/internal/tlsfiles"
	"github.com/prefixmesh/prefixmesh/local"
	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
)

// pinsApplyEvery is how often the node re-applies its prefix pins besides on every table change:
// a pinned prefix becomes cached when a request brings it, which changes no table (pins.Applier).
// A second bounds how long a freshly cached pinned prefix stays evictable.
const pinsApplyEvery = time.Second

// routerPoll is how often the router addresses learnt from gossip are refreshed (without
// --pins-addr): once a second, under gossip's own failure detection.
const routerPoll = time.Second

// pinFollower follows the cluster's pin table (a pins.TableCopy over a router's Pins.Watch) and
// makes the tree hold the prefix pins that name this node (pins.Applier).
type pinFollower struct {
	cc      *grpc.ClientConn
	table   *pins.TableCopy
	applier *pins.Applier
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	held, pending prometheus.Gauge
	connected     prometheus.GaugeFunc
}

// startPins starts following the pin table: from --pins-addr, or, without it, from the voter
// routers gossip knows (nil, nil when neither is available: a standalone node has no pins).
func startPins(ctx context.Context, cfg Config, tree *local.RadixTree, agent *cluster.Agent, logger *slog.Logger,
	reg prometheus.Registerer) (*pinFollower, error) {
	if cfg.PinsAddr == "" && agent == nil {
		return nil, nil
	}
	dial, err := clientCredentials(cfg)
	if err != nil {
		return nil, err
	}
	f := &pinFollower{applier: pins.NewApplier(tree, cfg.BlockSize)}
	var res *manual.Resolver
	target := cfg.PinsAddr
	opts := []grpc.DialOption{dial}
	if target == "" {
		res = manual.NewBuilderWithScheme("prefixmesh-pins")
		target = res.Scheme() + ":///routers"
		opts = append(opts, grpc.WithResolvers(res))
	}
	if f.cc, err = grpc.NewClient(target, opts...); err != nil {
		return nil, fmt.Errorf("dial pins %q: %w", target, err)
	}
	f.table = pins.NewTableCopy(pb.NewPinsClient(f.cc))
	if err := f.registerMetrics(reg); err != nil {
		_ = f.cc.Close()
		return nil, err
	}
	ctx, f.cancel = context.WithCancel(ctx)
	f.wg.Add(2)
	go func() {
		defer f.wg.Done()
		_ = f.table.Run(ctx)
	}()
	go func() {
		defer f.wg.Done()
		f.apply(ctx, cfg.NodeID)
	}()
	if res != nil {
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			followRouters(ctx, res, agent)
		}()
	}
	logger.Info("following pins", "from", cfg.PinsAddr, "gossip", cfg.PinsAddr == "")
	return f, nil
}

func (f *pinFollower) registerMetrics(reg prometheus.Registerer) error {
	f.held = prometheus.NewGauge(prometheus.GaugeOpts{Name: "prefixmesh_node_prefix_pins_held",
		Help: "Prefix pins naming this node whose cached blocks the node holds."})
	f.pending = prometheus.NewGauge(prometheus.GaugeOpts{Name: "prefixmesh_node_prefix_pins_pending",
		Help: "Prefix pins naming this node none of whose blocks is cached yet."})
	f.connected = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "prefixmesh_node_pins_connected",
		Help: "1 while the node mirrors the pin table from a live router stream."}, func() float64 {
		if f.table.Connected() {
			return 1
		}
		return 0
	})
	for _, c := range []prometheus.Collector{f.held, f.pending, f.connected} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("register pins metrics: %w", err)
		}
	}
	return nil
}

// apply is pins.Applier.Run with its statistics exported: apply after every table change and
// every pinsApplyEvery until ctx ends, then release every hold.
func (f *pinFollower) apply(ctx context.Context, node string) {
	ch, stop := f.table.Subscribe()
	defer stop()
	t := time.NewTicker(pinsApplyEvery)
	defer t.Stop()
	for {
		st := f.applier.Apply(f.table.PrefixPinsFor(node))
		f.held.Set(float64(st.Held))
		f.pending.Set(float64(st.Pending))
		select {
		case <-ctx.Done():
			f.applier.ReleaseAll()
			f.held.Set(0)
			return
		case <-ch:
		case <-t.C:
		}
	}
}

// close stops following, releases the holds and closes the connection.
func (f *pinFollower) close() {
	if f == nil {
		return
	}
	f.cancel()
	f.wg.Wait()
	_ = f.cc.Close()
}

// followRouters points res at the gRPC addresses of the live routers that run a pin-store
// voter (they publish a Raft address) until ctx ends; gRPC picks a live one and the table copy's
// Watch moves when it goes away.
func followRouters(ctx context.Context, res *manual.Resolver, agent *cluster.Agent) {
	t := time.NewTicker(routerPoll)
	defer t.Stop()
	var last []string
	first := true
	for {
		var addrs []string
		for _, m := range agent.Members() {
			if m.Role == cluster.RoleRouter && m.RaftAddr != "" && m.GRPCAddr != "" {
				addrs = append(addrs, m.GRPCAddr)
			}
		}
		slices.Sort(addrs)
		if first || !slices.Equal(addrs, last) {
			st := resolver.State{}
			for _, a := range addrs {
				st.Addresses = append(st.Addresses, resolver.Address{Addr: a})
			}
			res.UpdateState(st)
			last, first = addrs, false
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// clientCredentials are how the agent dials routers: plaintext, or with --tls-cert, mutual TLS
// with this node's certificate, verifying the router against --tls-client-ca (the cluster CA;
// the system roots when unset).
func clientCredentials(cfg Config) (grpc.DialOption, error) {
	if cfg.TLSCert == "" {
		return grpc.WithTransportCredentials(insecure.NewCredentials()), nil
	}
	tc, err := tlsfiles.Client(cfg.TLSCert, cfg.TLSKey, cfg.TLSClientCA)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert/--tls-key/--tls-client-ca: %w", err)
	}
	tc.ServerName = cfg.TLSServerName
	return grpc.WithTransportCredentials(credentials.NewTLS(tc)), nil
}
