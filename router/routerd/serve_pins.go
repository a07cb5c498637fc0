package routerd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/prefixmesh/prefixmesh/cluster"
	"github.com/prefixmesh/prefixmesh/cluster/pins"
	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
	"github.com/prefixmesh/prefixmesh/router"
)

// reconcileEvery is how often the leader brings the Raft configuration in line with gossip
// membership: once a second, well under gossip's own failure detection (a few seconds), so a
// dead voter is replaced about as fast as gossip notices it. Reconcile is idempotent and cheap
// on followers (it only records addresses).
const reconcileEvery = time.Second

// bootstrapPoll is how often a router waiting for --raft-bootstrap-expect voters looks at gossip.
const bootstrapPoll = 100 * time.Millisecond

// pinPlane is the router's share of the pin table (cluster/pins/DESIGN.md): a Raft voter (the store, its
// Pins gRPC service and the reconcile loop), or, without Raft, a mirror of a voter router's
// table. Routing reads it through table, locally, so losing quorum never stops routing.
type pinPlane struct {
	cfg      ServeConfig
	log      *slog.Logger
	table    *router.SwitchPins
	pc       pins.Config // the store's configuration (voters)
	store    *pins.Store // nil until started, and for non-voters
	raftAddr string      // published in gossip; "" when not a voter
	dial     grpc.DialOption

	stopping chan struct{} // closed on drain: ends Pins Watch streams so GracefulStop can finish
	stopOnce sync.Once
	cancel   context.CancelFunc
	wg       sync.WaitGroup // the reconcile or follow loop
}

// newPinPlane prepares the pin plane. A voter that can start on its own (--raft-bootstrap-expect
// 0 or 1, or a restart with state on disk) starts its store at once, so the Raft address it
// bound goes into this router's gossip metadata; one that must first see its bootstrap peers
// publishes the address it will bind and starts in awaitBootstrap.
func newPinPlane(ctx context.Context, cfg ServeConfig, grpcAddr, gossipAdvertise string, t tlsSetup, reg prometheus.Registerer,
	logger *slog.Logger, raftLog io.Writer) (*pinPlane, error) {
	p := &pinPlane{cfg: cfg, log: logger, table: &router.SwitchPins{}, dial: t.dialOption(), stopping: make(chan struct{})}
	if !cfg.raftEnabled() {
		return p, nil
	}
	advertise, err := raftAdvertise(ctx, cfg, gossipAdvertise, advertiseResolveWait)
	if err != nil {
		return nil, err
	}
	pc := pins.DefaultConfig()
	pc.ServerID = cfg.NodeID
	pc.DataDir = cfg.RaftDir
	pc.RaftBind = cfg.RaftListen
	pc.RaftAdvertise = advertise
	pc.GRPCAddr = grpcAddr
	pc.Voters = max(pc.Voters, cfg.RaftBootstrapExpect) // every expected router votes
	pc.ServerTLS, pc.ClientTLS = t.cluster, t.clusterClient
	pc.PeerDialOptions = []grpc.DialOption{p.dial}
	pc.LogOutput = raftLog
	pc.LogLevel = raftLogLevel(cfg.LogLevel)
	pc.Registerer = reg
	p.pc = pc
	if cfg.RaftBootstrapExpect > 1 && !hasRaftState(cfg.RaftDir) {
		p.raftAddr = advertise // known up front (Validate): peers see it while we wait for them
		return p, nil
	}
	if err := p.startStore(ctx, cfg.RaftBootstrapExpect == 1); err != nil {
		return nil, err
	}
	return p, nil
}

// startStore builds and starts the store; bootstrap starts a one-voter cluster if there is no
// state yet.
func (p *pinPlane) startStore(ctx context.Context, bootstrap bool) error {
	pc := p.pc
	pc.Bootstrap = bootstrap
	s, err := pins.New(pc)
	if err != nil {
		return fmt.Errorf("pin store: %w", err)
	}
	if err := s.Start(ctx); err != nil {
		return fmt.Errorf("pin store: %w", err)
	}
	p.store, p.raftAddr = s, s.RaftAddr()
	p.table.Set(s)
	return nil
}

// awaitBootstrap, for a voter of a new cluster of --raft-bootstrap-expect N > 1, waits until
// gossip shows N voter routers and starts the store: the one whose node id sorts first
// bootstraps a one-voter cluster, and its reconcile loop adds the others, which start empty and
// wait to be added. Every other plane returns at once.
func (p *pinPlane) awaitBootstrap(ctx context.Context, agent *cluster.Agent) error {
	if p.store != nil || !p.cfg.raftEnabled() {
		return nil
	}
	p.log.Info("waiting for pin store peers", "expect", p.cfg.RaftBootstrapExpect)
	t := time.NewTicker(bootstrapPoll)
	defer t.Stop()
	for {
		ids := []string{p.cfg.NodeID}
		for _, m := range voterRouters(agent.Members()) {
			if m.ID != p.cfg.NodeID {
				ids = append(ids, m.ID)
			}
		}
		if len(ids) >= p.cfg.RaftBootstrapExpect {
			first := slices.Min(ids) == p.cfg.NodeID
			if first {
				if leader := p.existingLeader(ctx, voterRouters(agent.Members())); leader != "" {
					// A member that lost its disk must rejoin, not found a second cluster.
					p.log.Warn("not bootstrapping: the pin cluster exists", "leader", leader)
					first = false
				}
			}
			p.log.Info("starting pin store", "bootstrap", first, "voters_seen", len(ids))
			return p.startStore(ctx, first)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// advertiseResolveWait bounds how long the Raft advertise name may take to resolve: under
// Kubernetes a StatefulSet pod's DNS record appears a few seconds after the pod starts, and
// failing at once would only crash-loop the router; 30 s is well inside its startup probe.
const advertiseResolveWait = 30 * time.Second

// raftAdvertise is the address peers dial: --raft-advertise, else the listen address with an
// unspecified host replaced by the gossip advertise host or the first private address. An
// explicit port 0 stays "" and the store advertises what it bound. A name is resolved (raft
// compares addresses), retrying for up to wait.
func raftAdvertise(ctx context.Context, cfg ServeConfig, gossipAdvertise string, wait time.Duration) (string, error) {
	addr := cfg.RaftAdvertise
	if addr == "" {
		host, port, err := net.SplitHostPort(cfg.RaftListen)
		if err != nil {
			return "", fmt.Errorf("--raft-listen: %w", err)
		}
		if port == "0" {
			return "", nil
		}
		if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
			host = cluster.ReachableHost(gossipAdvertise)
		}
		addr = net.JoinHostPort(host, port)
	}
	deadline := time.Now().Add(wait)
	for {
		tcp, err := net.ResolveTCPAddr("tcp", addr)
		if err == nil {
			return tcp.String(), nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("--raft-advertise %q: %w", addr, err)
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("--raft-advertise %q: %w", addr, ctx.Err())
		case <-time.After(time.Second):
		}
	}
}

// hasRaftState reports whether dir holds a Raft log (pins.Config: "raft.db"): a restarted
// member rejoins its cluster at once instead of waiting to bootstrap.
func hasRaftState(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "raft.db"))
	return err == nil
}

// raftLogLevel maps --log-level to hclog's: Raft's info lines (every heartbeat change) are noise
// at our info level, so it logs at warn unless we debug.
func raftLogLevel(level string) string {
	switch strings.ToLower(level) {
	case "debug":
		return "debug"
	case "error":
		return "error"
	}
	return "warn"
}

// register adds the Pins and PinsPeer services to g (voters, once the store has started).
func (p *pinPlane) register(g *grpc.Server, tokenize pins.TokenizeFunc) {
	if p.store != nil {
		pins.NewService(p.store, tokenize).Register(g)
	}
}

// start runs the plane's loop until shutdown: a voter reconciles the Raft configuration with
// gossip; a non-voter follows a voter router's table.
func (p *pinPlane) start(ctx context.Context, agent *cluster.Agent) {
	ctx, p.cancel = context.WithCancel(ctx)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		if p.store == nil {
			p.follow(ctx, agent)
			return
		}
		p.reconcile(ctx, agent)
	}()
}

// leaderProbeTimeout bounds asking one peer whether it knows a leader: peers that are
// themselves waiting to bootstrap do not serve gRPC yet, and must not hold up the decision.
const leaderProbeTimeout = time.Second

// existingLeader asks the other voter routers' Pins service, in parallel, for the leader they
// know, and returns one that is named ("" when nobody knows one, or nobody answers in time).
func (p *pinPlane) existingLeader(ctx context.Context, peers []pins.Member) string {
	ctx, cancel := context.WithTimeout(ctx, leaderProbeTimeout)
	defer cancel()
	leaders := make(chan string, len(peers))
	var wg sync.WaitGroup
	for _, m := range peers {
		if m.ID == p.cfg.NodeID || m.GRPCAddr == "" {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			cc, err := grpc.NewClient(m.GRPCAddr, p.dial)
			if err != nil {
				return
			}
			defer cc.Close()
			if l, err := pb.NewPinsClient(cc).List(ctx, &pb.ListPinsRequest{}); err == nil && l.GetLeaderId() != "" {
				leaders <- l.GetLeaderId()
			}
		}()
	}
	wg.Wait()
	close(leaders)
	return <-leaders // "" when the channel is empty
}

// voterRouters are the live routers that publish a Raft address.
func voterRouters(members []cluster.Meta) []pins.Member {
	out := make([]pins.Member, 0, len(members))
	for _, m := range members {
		if m.Role == cluster.RoleRouter && m.RaftAddr != "" {
			out = append(out, pins.Member{ID: m.NodeID, RaftAddr: m.RaftAddr, GRPCAddr: m.GRPCAddr})
		}
	}
	return out
}

// reconcile calls Store.Reconcile with the live voter routers every reconcileEvery until ctx
// ends: on the leader, live routers become voters and departed ones are removed.
func (p *pinPlane) reconcile(ctx context.Context, agent *cluster.Agent) {
	t := time.NewTicker(reconcileEvery)
	defer t.Stop()
	var lastErr string
	for {
		rctx, cancel := context.WithTimeout(ctx, reconcileEvery)
		err := p.store.Reconcile(rctx, voterRouters(agent.Members()))
		cancel()
		if err != nil && err.Error() != lastErr && ctx.Err() == nil {
			p.log.Warn("pin store reconcile", "err", err)
		}
		lastErr = ""
		if err != nil {
			lastErr = err.Error()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// follow mirrors the table of a voter router (any live one gossip knows; the connection moves
// when they change) until ctx ends.
func (p *pinPlane) follow(ctx context.Context, agent *cluster.Agent) {
	cc, res, err := gossipPinsConn(p.dial)
	if err != nil {
		p.log.Error("pin table follower", "err", err)
		return
	}
	defer cc.Close()
	m := pins.NewTableCopy(pb.NewPinsClient(cc))
	p.table.Set(m)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = m.Run(ctx)
	}()
	updatePinsAddrs(ctx, res, agent, p.cfg.NodeID)
	wg.Wait()
}

// gossipPinsConn is a client connection whose addresses are set by updatePinsAddrs.
func gossipPinsConn(dial grpc.DialOption) (*grpc.ClientConn, *manual.Resolver, error) {
	res := manual.NewBuilderWithScheme("prefixmesh-pins")
	cc, err := grpc.NewClient(res.Scheme()+":///voters", dial, grpc.WithResolvers(res))
	if err != nil {
		return nil, nil, fmt.Errorf("dial pins: %w", err)
	}
	return cc, res, nil
}

// updatePinsAddrs feeds res the gRPC addresses of the live voter routers (self excluded) every
// reconcileEvery until ctx ends.
func updatePinsAddrs(ctx context.Context, res *manual.Resolver, agent *cluster.Agent, self string) {
	t := time.NewTicker(reconcileEvery)
	defer t.Stop()
	var last []string
	for {
		var addrs []string
		for _, m := range voterRouters(agent.Members()) {
			if m.ID != self && m.GRPCAddr != "" {
				addrs = append(addrs, m.GRPCAddr)
			}
		}
		slices.Sort(addrs)
		if !slices.Equal(addrs, last) {
			st := resolver.State{}
			for _, a := range addrs {
				st.Addresses = append(st.Addresses, resolver.Address{Addr: a})
			}
			res.UpdateState(st)
			last = addrs
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// streamGate ends Pins streams (Watch) when the router drains: they are endless, and
// GracefulStop waits for every stream.
func (p *pinPlane) streamGate(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if !strings.HasPrefix(info.FullMethod, "/"+pb.Pins_ServiceDesc.ServiceName+"/") {
		return h(srv, ss)
	}
	ctx, cancel := context.WithCancel(ss.Context())
	defer cancel()
	go func() {
		select {
		case <-p.stopping:
			cancel()
		case <-ctx.Done():
		}
	}()
	return h(srv, &ctxStream{ServerStream: ss, ctx: ctx})
}

// ctxStream overrides a server stream's context.
type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *ctxStream) Context() context.Context { return s.ctx }

// endStreams ends every Pins Watch stream (drain).
func (p *pinPlane) endStreams() { p.stopOnce.Do(func() { close(p.stopping) }) }

// stopLoop stops the reconcile or follow loop and waits for it.
func (p *pinPlane) stopLoop() {
	if p.cancel != nil {
		p.cancel()
	}
	p.wg.Wait()
}

// shutdown ends Watch streams, stops the loop and the store; the leader hands leadership to
// another voter first (bounded by ctx).
func (p *pinPlane) shutdown(ctx context.Context) error {
	p.endStreams()
	p.stopLoop()
	if p.store == nil {
		return nil
	}
	if err := p.store.Shutdown(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}
