// Package routerd is the router daemon's life (`prefixmesh-router serve`), importable so that
// cmd/router and the one-process demo run the same code. It joins the gossip cluster and mirrors
// every node's cache summary into the routing index; keeps the Raft-replicated pin table as a
// voter (or follows a voter's); and serves the OpenAI-compatible front door (router/frontdoor)
// beside /metrics and /healthz on HTTP, and Router.Route, Pins, grpc.health.v1 and reflection
// on gRPC. Both routing paths read placement pins locally, so a router without Raft quorum keeps
// routing. config_serve.go holds the flags, serve.go the lifecycle, serve_pins.go the pin plane
// (store, bootstrap, reconcile with gossip membership, follower), serve_http.go the front door
// and HTTP mux, serve_tls.go the TLS configurations.
package routerd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/prefixmesh/prefixmesh/cluster"
	"github.com/prefixmesh/prefixmesh/cluster/pins"
	"github.com/prefixmesh/prefixmesh/internal/addrfile"
	"github.com/prefixmesh/prefixmesh/internal/connstats"
	"github.com/prefixmesh/prefixmesh/internal/shutdown"
	"github.com/prefixmesh/prefixmesh/internal/tokenizer"
	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
	"github.com/prefixmesh/prefixmesh/router"
	"github.com/prefixmesh/prefixmesh/router/share"
	"github.com/prefixmesh/prefixmesh/routing"
)

// syncPoll is how often serve checks whether the mirror has synced every known node.
const syncPoll = 50 * time.Millisecond

// Main is `prefixmesh-router serve`: exit 0 after a clean run, 2 for a bad configuration,
// 1 when the router failed.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := parseServeConfig(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "prefixmesh-router serve: %v\n", err)
		return 2
	}
	if cfg.ValidateOnly {
		fmt.Fprintln(stdout, "ok")
		return 0
	}
	if err := Run(ctx, cfg, stderr); err != nil {
		fmt.Fprintf(stderr, "prefixmesh-router serve: %v\n", err)
		return 1
	}
	return 0
}

// Run is the router's life (STYLE.md §4): build in dependency order, health NOT_SERVING until
// the mirror has synced every node it knows, serve, and on ctx's end drain in reverse within
// DrainTimeout: NOT_SERVING, the front door finishes its streams, the pin plane stops
// reconciling, the router leaves gossip, the Raft leader hands over, the servers stop.
func Run(ctx context.Context, cfg ServeConfig, stderr io.Writer) error {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel)) // validated
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	tlsCfg, err := loadTLS(cfg)
	if err != nil {
		return err
	}
	var undo []func() // until the router serves: on a failed or cancelled start, in reverse
	defer func() {
		if undo != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
	}()

	// 1. Listen first: the gRPC address goes into our gossip metadata and the pin store.
	grpcLis, err := net.Listen("tcp", cfg.GRPCListen)
	if err != nil {
		return fmt.Errorf("grpc listen: %w", err)
	}
	undo = append(undo, func() { _ = grpcLis.Close() })
	httpLis, err := net.Listen("tcp", cfg.HTTPListen)
	if err != nil {
		return fmt.Errorf("http listen: %w", err)
	}
	undo = append(undo, func() { _ = httpLis.Close() })
	var metricsLis net.Listener
	if cfg.MetricsListen != "" {
		if metricsLis, err = net.Listen("tcp", cfg.MetricsListen); err != nil {
			return fmt.Errorf("metrics listen: %w", err)
		}
		undo = append(undo, func() { _ = metricsLis.Close() })
	}
	var plaintext string
	if cfg.plaintextGRPC() {
		plaintext = "gRPC (pin writes, Raft proposals) serves without TLS on " + grpcLis.Addr().String()
		logger.Warn("plaintext gRPC on a non-loopback address (--insecure-grpc): anyone who reaches it can change pins", "grpc", grpcLis.Addr().String())
		plaintextGauge := prometheus.NewGauge(prometheus.GaugeOpts{Name: "prefixmesh_router_grpc_plaintext",
			Help: "1 when gRPC serves without TLS on a non-loopback address (--insecure-grpc)."})
		plaintextGauge.Set(1)
		reg.MustRegister(plaintextGauge)
	}
	grpcAddr := cfg.GRPCAdvertise
	if grpcAddr == "" {
		// Peers dial this address: a wildcard bind (":7070", as in Kubernetes) is announced with
		// the gossip advertise host or this host's first private address, never "[::]".
		grpcAddr = cluster.ReachableAddr(grpcLis.Addr(), advertiseHost(cfg.Gossip.Advertise))
	}

	// 2. The pin plane: a Raft voter starts here when it needs no peers, so that its Raft
	// address can go into the gossip metadata.
	plane, err := newPinPlane(ctx, cfg, grpcAddr, advertiseHost(cfg.Gossip.Advertise), tlsCfg, reg,
		logger.With("component", "pins"), stderr)
	if err != nil {
		return err
	}
	undo = append(undo, func() { _ = plane.shutdown(context.Background()) })

	// 3. The summary index and the gossip agent that feeds it.
	icfg := routing.DefaultIndexConfig()
	icfg.MaxBytes = cfg.IndexMaxBytes
	idx := routing.NewIndex(icfg)
	fetcher := cluster.NewGRPCFetcher(tlsCfg.dialOption())
	defer fetcher.Close()
	gcfg := cluster.DefaultConfig(cluster.RoleRouter, cfg.NodeID)
	if err := cfg.Gossip.Apply(&gcfg); err != nil {
		return err
	}
	gcfg.Meta.GRPCAddr = grpcAddr
	gcfg.Meta.RaftAddr = plane.raftAddr
	gcfg.Logger = logger.With("component", "gossip")
	gcfg.Registry = reg
	agent, err := cluster.New(gcfg, cluster.Deps{Index: idx, Fetcher: fetcher})
	if err != nil {
		return err
	}

	// 4. One decision path for Route and the front door: the same policy instance, overlay and
	// in-flight counts, whichever door a request comes through.
	pol, err := routing.NewPolicy(cfg.Policy, cfg.policyConfig())
	if err != nil {
		return err
	}
	decider, err := routing.NewDecider(idx, routing.NewOverlay(0, 0), pol, routing.DeciderConfig{})
	if err != nil {
		return err
	}

	// The other routers hear of every decision and of our in-flight load, and we of theirs.
	sharer, err := share.New(share.DefaultConfig(cfg.NodeID), decider, agent, reg)
	if err != nil {
		return err
	}

	// The OpenAI-compatible front door, built before Route so that both doors leave out the
	// nodes its passive health ejects.
	fd, err := newFrontDoor(cfg, tlsCfg, agent.Mirror(), idx, decider, plane.table, reg, logger.With("component", "frontdoor"))
	if err != nil {
		return err
	}

	// Route and Pins over gRPC; health NOT_SERVING until the mirror has synced.
	rcfg := router.DefaultConfig()
	rcfg.Ejector = fd.Health
	rcfg.Policy = cfg.Policy
	rcfg.PolicyConfig = cfg.policyConfig()
	rcfg.Pins = plane.table
	rcfg.Decider = decider
	var tokenize pins.TokenizeFunc
	if tok, err := tokenizer.New(cfg.Tokenizer); err == nil { // engine and none: token ids only
		rcfg.Tokenizer = tok
		tokenize = func(text string) ([]uint32, error) { return tokenizer.EncodePrompt(context.Background(), tok, text) }
	}
	routeSrv, err := router.NewServer(router.NewView(agent.Mirror(), idx), rcfg, reg)
	if err != nil {
		return err
	}
	conns, err := connstats.New(reg) // issue 15: garbage connections counted, not logged
	if err != nil {
		return err
	}
	grpcSrv := grpc.NewServer(grpc.Creds(tlsCfg.grpcServerCreds()), grpc.ChainStreamInterceptor(plane.streamGate),
		grpc.StatsHandler(conns.StatsHandler()))
	routeSrv.Register(grpcSrv)
	healthSrv := health.NewServer()
	healthSrv.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	healthSrv.SetServingStatus(pb.Router_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(grpcSrv, healthSrv)
	reflection.Register(grpcSrv)

	// 5. The OpenAI-compatible front door beside /metrics and /healthz (built above).
	var ready atomic.Bool
	var gossipOK gossipHealth
	httpSrv := httpServer(ctx, fd, reg, metricsLis == nil, &ready, gossipOK.notServing, plaintext, logger)
	var metricsSrv *http.Server
	if metricsLis != nil {
		metricsSrv = metricsServer(reg)
	}

	// 6. Join, start the pin store once its bootstrap peers are known, serve.
	if err := agent.Start(ctx); err != nil {
		return err
	}
	undo = append(undo, func() { _ = agent.Close(context.Background()) })
	sharer.Start(ctx)
	undo = append(undo, sharer.Close)
	fd.start(ctx)
	undo = append(undo, func() { _ = fd.Shutdown(context.Background()) })
	served := make(chan error, 3)
	go func() { served <- serveErr("http", serveHTTP(httpSrv, httpLis)) }()
	undo = append(undo, func() { _ = httpSrv.Close(); <-served })
	pending := 2 // servers whose exit the drain waits for
	if metricsSrv != nil {
		go func() { served <- serveErr("metrics", metricsSrv.Serve(metricsLis)) }()
		undo = append(undo, func() { _ = metricsSrv.Close(); <-served })
		pending++
	}
	// Issue 15: health follows gossip from here on (a router stuck waiting for pin store peers
	// says why on /healthz); SERVING once synced (step 7), and only while gossip is not isolated.
	waitCtx, stopWait := context.WithCancel(ctx)
	defer stopWait()
	syncedCh := make(chan struct{})
	var waiters sync.WaitGroup
	waiters.Go(func() { gossipOK.follow(waitCtx, agent, syncedCh, healthSrv, &ready, logger) })
	undo = append(undo, func() { stopWait(); waiters.Wait() })
	raftAddr := plane.raftAddr
	if raftAddr == "" {
		raftAddr = "-"
	}
	// Listening: gRPC calls that arrive before Serve (below) wait in the listen backlog.
	addrs := []string{"grpc=" + grpcLis.Addr().String(), "http=" + httpLis.Addr().String(), "gossip=" + agent.GossipAddr(), "raft=" + raftAddr}
	if metricsLis != nil {
		addrs = append(addrs, "metrics="+metricsLis.Addr().String())
	}
	if cfg.AddrFile != "" {
		if err := addrfile.Write(cfg.AddrFile, addrs...); err != nil {
			logger.Error("write addr file", "err", err)
		}
	}
	logger.Info("listening", "grpc", grpcLis.Addr().String(), "http", httpLis.Addr().String(),
		"gossip", agent.GossipAddr(), "raft", plane.raftAddr, "node_id", cfg.NodeID, "policy", cfg.Policy)
	if err := plane.awaitBootstrap(ctx, agent); err != nil {
		if ctx.Err() != nil {
			return nil // stopped while waiting for peers: nothing was served
		}
		return err
	}
	plane.register(grpcSrv, tokenize)
	plane.start(ctx, agent)
	go func() { served <- serveErr("grpc", grpcSrv.Serve(conns.Listener(grpcLis))) }()
	undo = nil // from here on, the drain below stops everything

	// 7. SERVING once every node we know has been synced (and, with seeds, once we know someone),
	// NOT_SERVING whenever gossip is isolated afterwards.
	waiters.Go(func() {
		awaitSync(waitCtx, cfg, agent, logger)
		if waitCtx.Err() == nil {
			close(syncedCh)
		}
	})

	var runErr error
	select {
	case <-ctx.Done():
		logger.Info("shutting down", "drain_timeout", cfg.DrainTimeout)
	case runErr = <-served:
		pending--
		logger.Error("server failed", "err", runErr)
	}

	// 8. Drain in reverse, all within DrainTimeout.
	stopWait()
	waiters.Wait()
	ready.Store(false)
	healthSrv.Shutdown() // NOT_SERVING, and health Watch streams end
	drainCtx, cancel := context.WithTimeout(context.Background(), cfg.DrainTimeout)
	defer cancel()
	if err := fd.Shutdown(drainCtx); err != nil {
		logger.Warn("front door drain incomplete", "err", err)
	}
	plane.stopLoop() // no reconcile against a membership we are leaving
	sharer.Close()   // the front door is drained: nothing left to tell the other routers
	if err := agent.Close(drainCtx); err != nil {
		logger.Warn("gossip leave", "err", err)
	}
	if err := plane.shutdown(drainCtx); err != nil { // the leader hands over first
		logger.Warn("pin store shutdown", "err", err)
	}
	httpSrvs := []*http.Server{httpSrv}
	if metricsSrv != nil {
		httpSrvs = append(httpSrvs, metricsSrv)
	}
	shutdown.Servers(drainCtx, logger, grpcSrv, httpSrvs...)
	for ; pending > 0; pending-- {
		if err := <-served; err != nil && runErr == nil {
			runErr = err
		}
	}
	logger.Info("stopped")
	return runErr
}

// awaitSync returns once the mirror has synced every node it knows (and, with seeds, once it
// knows another member), after SyncTimeout, or when ctx ends.
func awaitSync(ctx context.Context, cfg ServeConfig, agent *cluster.Agent, logger *slog.Logger) {
	t := time.NewTicker(syncPoll)
	defer t.Stop()
	start := time.Now()
	for {
		synced := agent.Mirror().Synced() && (len(cfg.Gossip.Join) == 0 || len(agent.Members()) > 1)
		if synced {
			return
		}
		if cfg.SyncTimeout > 0 && time.Since(start) > cfg.SyncTimeout {
			var missing []string
			for _, n := range agent.Mirror().Nodes() {
				if !n.Synced {
					missing = append(missing, n.Meta.NodeID)
				}
			}
			logger.Warn("serving before every node synced", "sync_timeout", cfg.SyncTimeout, "unsynced", missing)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// serveHTTP serves HTTPS when the server has a TLS configuration.
func serveHTTP(s *http.Server, lis net.Listener) error {
	if s.TLSConfig != nil {
		return s.ServeTLS(lis, "", "")
	}
	return s.Serve(lis)
}

// advertiseHost is the host part of --gossip-advertise (host or host:port).
func advertiseHost(advertise string) string {
	if h, _, err := net.SplitHostPort(advertise); err == nil {
		return h
	}
	return advertise
}

// serveErr reports a server's exit: nil for a requested stop, else the error with its name.
func serveErr(name string, err error) error {
	if err == nil || errors.Is(err, http.ErrServerClosed) || errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	return fmt.Errorf("%s serve: %w", name, err)
}
