package agentd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/prefixmesh/prefixmesh/cluster"
	"github.com/prefixmesh/prefixmesh/internal/addrfile"
	"github.com/prefixmesh/prefixmesh/internal/connstats"
	"github.com/prefixmesh/prefixmesh/internal/ratelog"
	"github.com/prefixmesh/prefixmesh/internal/shutdown"
	"github.com/prefixmesh/prefixmesh/internal/tlsfiles"
	"github.com/prefixmesh/prefixmesh/local"
	"github.com/prefixmesh/prefixmesh/node"
	"github.com/prefixmesh/prefixmesh/node/kvevents"
	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
)

// HTTP server timeouts. No WriteTimeout: the simulated engine streams completions for as long as
// decoding takes, and a write deadline would cut them off.
const (
	readHeaderTimeout = 10 * time.Second // a slow-loris client cannot hold a connection forever
	idleTimeout       = 2 * time.Minute  // keep-alive connections of routers are reused, then reaped
)

// Run is the node agent's life (STYLE.md §4): build in dependency order, start health as
// NOT_SERVING, serve, flip to SERVING, and when ctx ends (SIGTERM) drain in reverse within
// cfg.DrainTimeout. It returns nil after a clean drain.
func Run(ctx context.Context, cfg Config, stderr io.Writer) error {
	level, err := parseLogLevel(cfg.LogLevel)
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	// 1. The cache: the only authority on what this node holds (DESIGN.md §1). With a real
	// engine (--engine=vllm|sglang) that is the engine's own cache, mirrored from its KV events.
	var (
		tree   *local.RadixTree
		mirror *kvevents.Mirror
		view   cacheView
	)
	if mirrored(cfg.Engine) {
		mirror = kvevents.NewMirror(cfg.BlockSize)
		view = mirror
	} else {
		tree = local.NewRadixTree(local.Options{})
		view = tree
	}

	// 2. The NodeCache service over it. The simulated engine's KV pool must see every reference
	// its cache calls move, and a mirrored engine owns its cache, so then remote callers only read.
	cacheSrv, err := node.New(view, node.Config{
		NodeID:    cfg.NodeID,
		BlockSize: cfg.BlockSize,
		Logger:    logger.With("component", "nodecache"),
		Registry:  reg,
		ReadOnly:  cfg.Engine == engineSim || mirrored(cfg.Engine),
		Owner:     cacheOwner(cfg.Engine),
	})
	if err != nil {
		return fmt.Errorf("node cache service: %w", err)
	}

	// 3. The gRPC server: NodeCache, health (NOT_SERVING until we are ready) and reflection.
	creds, err := serverCredentials(cfg)
	if err != nil {
		return err
	}
	conns, err := connstats.New(reg) // issue 15: garbage connections counted, not logged
	if err != nil {
		return fmt.Errorf("connection metrics: %w", err)
	}
	grpcSrv := grpc.NewServer(append(cacheSrv.ServerOptions(), grpc.Creds(creds), grpc.StatsHandler(conns.StatsHandler()))...)
	cacheSrv.Register(grpcSrv)
	healthSrv := node.NewHealth(pb.NodeCache_ServiceDesc.ServiceName)
	healthpb.RegisterHealthServer(grpcSrv, healthSrv)
	reflection.Register(grpcSrv)

	// 4. The HTTP server: /metrics, /healthz, and whatever the engine mounts.
	var ready atomic.Bool
	var gossipOK cluster.HealthGate // an isolated member is not serving
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready.Load() {
			http.Error(w, "not serving", http.StatusServiceUnavailable)
			return
		}
		if reason := gossipOK.NotServing(); reason != "" {
			http.Error(w, "not serving: "+reason, http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	errLog, err := ratelog.ErrorLog(logger, reg) // issue 15: counted, a few lines per interval
	if err != nil {
		return fmt.Errorf("http error log metrics: %w", err)
	}
	httpSrv := &http.Server{Handler: mux, ReadHeaderTimeout: readHeaderTimeout, IdleTimeout: idleTimeout, ErrorLog: errLog}

	// 5. The engine. It outlives the HTTP drain (in-flight completions finish), so it gets its own
	// context, cancelled only after the HTTP server has shut down.
	engineCtx, cancelEngine := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelEngine()
	var ann *announcer // a mirrored engine's restarts (new epoch) and completeness (cold) to routers
	if mirror != nil {
		ann = newAnnouncer(cacheSrv, logger.With("component", "kvevents"))
	}
	side, err := startEngine(engineCtx, &cfg, tree, mirror, ann, logger, reg, mux)
	if err != nil {
		return fmt.Errorf("start engine: %w", err)
	}
	closeEngine := side.close
	defer closeEngine()

	// 6. Listen, then serve.
	grpcLis, err := listen(cfg.GRPCListen)
	if err != nil {
		return fmt.Errorf("grpc listen: %w", err)
	}
	httpLis, err := net.Listen("tcp", cfg.HTTPListen)
	if err != nil {
		_ = grpcLis.Close()
		return fmt.Errorf("http listen: %w", err)
	}
	// 6b. Gossip (with --gossip-listen): publish this node's summary and load to the routers.
	agent, err := startGossip(ctx, cfg, view, cacheSrv.Epoch(), ann.cold(), grpcLis.Addr(), httpLis.Addr(), side.load, logger, reg)
	if err != nil {
		_ = grpcLis.Close()
		_ = httpLis.Close()
		return fmt.Errorf("gossip: %w", err)
	}

	// 6c. Pins: follow the pin table and hold this node's prefix pins in the tree.
	var pinned *pinFollower
	if tree != nil {
		pinned, err = startPins(ctx, cfg, tree, agent, logger.With("component", "pins"), reg)
	} else {
		// A mirrored engine evicts on its own; the agent cannot hold its blocks.
		logger.Info("prefix pins are not held on a mirrored engine")
	}
	if err != nil {
		if agent != nil {
			_ = agent.Close(context.Background())
		}
		_ = grpcLis.Close()
		_ = httpLis.Close()
		return fmt.Errorf("pins: %w", err)
	}

	served := make(chan error, 2)
	go func() { served <- serveErr("grpc", grpcSrv.Serve(conns.Listener(grpcLis))) }()
	go func() { served <- serveErr("http", httpSrv.Serve(httpLis)) }()
	addrs := append([]string{"grpc=" + addrString(grpcLis.Addr()), "http=" + httpLis.Addr().String()}, side.addrs...)
	if agent != nil {
		addrs = append(addrs, "gossip="+agent.GossipAddr()) // with --gossip-listen port 0, peers need it
	}
	if cfg.AddrFile != "" {
		if err := addrfile.Write(cfg.AddrFile, addrs...); err != nil {
			logger.Error("write addr file", "err", err)
		}
	}
	logger.Info("listening", "grpc", addrString(grpcLis.Addr()), "http", httpLis.Addr().String(),
		"node_id", cfg.NodeID, "epoch", fmt.Sprintf("%016x", cacheSrv.Epoch()), "engine", cfg.Engine, "extra", strings.Join(side.addrs, " "))

	// The node's metadata is published by the gossip agent's Start above; routers pull its
	// summary on their own, so the node is ready as soon as it listens (beside a real engine:
	// whenever that engine is healthy) and, with gossip, has joined; it reports NOT_SERVING
	// again while the engine is down or the node is isolated. Both watchers feed one verdict.
	var verdictMu sync.Mutex // serializes verdicts, so the last one reads both inputs' latest
	applyHealth := func() {
		verdictMu.Lock()
		defer verdictMu.Unlock()
		healthSrv.SetServing(ready.Load() && gossipOK.NotServing() == "", pb.NodeCache_ServiceDesc.ServiceName)
	}
	healthCtx, stopHealth := context.WithCancel(ctx)
	defer stopHealth()
	engineDone := followHealth(healthCtx, side.healthy, &ready, applyHealth, logger)
	waitGossip := gossipOK.Follow(healthCtx, agent, func(cluster.Health) { applyHealth() }, logger.With("component", "gossip"))
	waitAnnounce := ann.start(healthCtx, agent)
	logger.Info("serving")

	var runErr error
	pending := 2 // servers whose Serve has not returned
	select {
	case <-ctx.Done():
		logger.Info("shutting down", "cause", context.Cause(ctx), "drain_timeout", cfg.DrainTimeout)
	case runErr = <-served: // a server died on its own: drain the other one, then report it
		pending--
		logger.Info("shutting down after a server failure", "drain_timeout", cfg.DrainTimeout)
	}

	// 7. Drain in reverse: stop advertising, let calls finish within the deadline, then cut; the
	// engine goes last so that completions still being served can finish.
	stopHealth()
	<-engineDone
	waitGossip()
	waitAnnounce()
	ready.Store(false)
	if agent != nil { // routers stop choosing this node, then it leaves the cluster
		announceDrain(agent, cfg.drainNotice(), logger)
		leaveCtx, cancelLeave := context.WithTimeout(context.Background(), cfg.DrainTimeout-cfg.drainNotice())
		if err := agent.Close(leaveCtx); err != nil {
			logger.Warn("gossip leave", "err", err)
		}
		cancelLeave()
	}
	drain(logger, cfg.DrainTimeout, healthSrv, grpcSrv, httpSrv)
	pinned.close() // releases the prefix pins' holds
	cancelEngine()
	closeEngine()
	for ; pending > 0; pending-- {
		if err := <-served; err != nil && runErr == nil {
			runErr = err
		}
	}
	logger.Info("stopped")
	return runErr
}

// cacheView is the node's cache as the NodeCache service and the gossip agent read it: a
// local.RadixTree, or a kvevents.Mirror of a real engine's cache.
type cacheView interface {
	node.Tree
	cluster.Source
}

var (
	_ cacheView = (*local.RadixTree)(nil)
	_ cacheView = (*kvevents.Mirror)(nil)
)

// followHealth makes the agent's readiness (ready, then apply: /healthz, grpc.health.v1) follow
// healthy, checked every probeInterval, until ctx ends; with healthy nil the agent is simply ready. The returned
// channel closes when the loop has stopped.
func followHealth(ctx context.Context, healthy func() bool, ready *atomic.Bool, apply func(), logger *slog.Logger) <-chan struct{} {
	done := make(chan struct{})
	set := func(ok bool) {
		ready.Store(ok)
		apply()
	}
	if healthy == nil {
		set(true)
		close(done)
		return done
	}
	set(healthy())
	go func() {
		defer close(done)
		t := time.NewTicker(probeInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if ok := healthy(); ok != ready.Load() {
					logger.Info("following the engine's health", "serving", ok)
					set(ok)
				}
			}
		}
	}()
	return done
}

// announceDrain gossips that this node is draining, so routers leave it out of new decisions
// (routing's eligibility skips draining nodes) while it keeps serving what they already sent
// and its summary stays theirs, and waits notice for every router to hear it.
func announceDrain(agent *cluster.Agent, notice time.Duration, logger *slog.Logger) {
	if notice <= 0 {
		return
	}
	if err := agent.SetDraining(true); err != nil {
		logger.Warn("announce draining", "err", err)
		return
	}
	logger.Info("draining: routers send nothing new; leaving gossip after the notice", "drain_notice", notice)
	t := time.NewTimer(notice)
	defer t.Stop()
	<-t.C
}

// drain stops both servers within timeout: health goes NOT_SERVING (and Watch streams end), then
// the gRPC and HTTP servers finish their in-flight calls in parallel; whatever is still open at
// the deadline is closed.
func drain(logger *slog.Logger, timeout time.Duration, h *node.Health, g *grpc.Server, hs *http.Server) {
	h.Drain()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	shutdown.Servers(ctx, logger, g, hs)
}

// serveErr reports a server's exit: nil for a requested stop, else the error with its name.
func serveErr(name string, err error) error {
	if err == nil || errors.Is(err, http.ErrServerClosed) || errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	return fmt.Errorf("%s serve: %w", name, err)
}

// listen opens a TCP listener for host:port or a Unix socket for unix:///path, removing a stale
// socket file left by a crashed predecessor.
func listen(addr string) (net.Listener, error) {
	path, ok := strings.CutPrefix(addr, "unix://")
	if !ok {
		return net.Listen("tcp", addr)
	}
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("remove stale socket: %w", err)
		}
	}
	return net.Listen("unix", path)
}

// addrString prints a listener address the way --grpc-listen takes it.
func addrString(a net.Addr) string {
	if a.Network() == "unix" {
		return "unix://" + a.String()
	}
	return a.String()
}

// serverCredentials are plaintext, TLS with --tls-cert/--tls-key, or mutual TLS when
// --tls-client-ca is also given (clients must present a certificate it signed).
func serverCredentials(cfg Config) (credentials.TransportCredentials, error) {
	if cfg.TLSCert == "" {
		return insecure.NewCredentials(), nil
	}
	tc, err := tlsfiles.Server(cfg.TLSCert, cfg.TLSKey, cfg.TLSClientCA)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert/--tls-key/--tls-client-ca: %w", err)
	}
	return credentials.NewTLS(tc), nil
}
