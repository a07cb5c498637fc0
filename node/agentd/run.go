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
	"github.com/prefixmesh/prefixmesh/internal/exposure"
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

// Run is the node agent's life, in phases: open the cache, build the servers with health
// NOT_SERVING, start the engine, listen and join, serve, follow health to SERVING, and when ctx
// ends (SIGTERM) drain in reverse within cfg.DrainTimeout. It returns nil after a clean drain.
func Run(ctx context.Context, cfg Config, stderr io.Writer) error {
	d, err := newDaemon(cfg, stderr)
	if err != nil {
		return err
	}
	d.openCache()
	if err := d.buildServers(); err != nil {
		return err
	}
	if err := d.startEngine(ctx); err != nil {
		if errors.Is(err, errStoppedEarly) {
			return nil
		}
		return err
	}
	defer d.cancelEngine()
	defer d.side.close()
	if err := d.listenAndJoin(ctx); err != nil {
		return err
	}
	served := d.serve()
	stopHealth := d.followHealth(ctx)
	runErr, pending := d.wait(ctx, served)
	d.drainAll(stopHealth)
	for ; pending > 0; pending-- {
		if err := <-served; err != nil && runErr == nil {
			runErr = err
		}
	}
	d.logger.Info("stopped")
	return runErr
}

// errStoppedEarly: ctx ended while the agent waited for its engine; nothing was served.
var errStoppedEarly = errors.New("stopped before serving")

// daemon is one run of the node agent: what each phase of Run builds and a later one uses.
type daemon struct {
	cfg    Config
	logger *slog.Logger
	reg    *prometheus.Registry

	// The cache (openCache): a tree, or a mirror of a real engine's cache.
	tree     *local.RadixTree
	mirror   *kvevents.CacheMirror
	restored *kvevents.Checkpoint // with --state-dir, what the mirror was restored from
	view     cacheView

	// The servers (buildServers).
	cacheSrv  *node.Server
	conns     *connstats.Counter
	grpcSrv   *grpc.Server
	healthSrv *node.Health
	mux       *http.ServeMux
	httpSrv   *http.Server
	ready     atomic.Bool        // the engine is healthy
	gossipOK  cluster.HealthGate // an isolated member is not serving

	// The engine (startEngine), with a context of its own: it outlives the HTTP drain.
	ann          *announcer // a mirrored engine's restarts (new epoch) and completeness (cold) to routers
	side         engineSide
	cancelEngine context.CancelFunc

	// Listening and joined (listenAndJoin).
	grpcLis, httpLis net.Listener
	agent            *cluster.Agent
	pinned           *pinFollower
}

func newDaemon(cfg Config, stderr io.Writer) (*daemon, error) {
	level, err := parseLogLevel(cfg.LogLevel)
	if err != nil {
		return nil, err
	}
	// The listener rule again, for callers of Run that did not validate: no listener opens
	// against it.
	if _, err := exposure.CheckAll(cfg.listeners()); err != nil {
		return nil, err
	}
	d := &daemon{cfg: cfg, logger: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})),
		reg: prometheus.NewRegistry(), cancelEngine: func() {}}
	d.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if err := registerInfo(d.reg, cfg); err != nil {
		return nil, fmt.Errorf("node info metric: %w", err)
	}
	return d, nil
}

// openCache opens the only authority on what this node holds: with a real engine
// (--engine=vllm|sglang) the engine's own cache, mirrored from its KV events (restored from
// --state-dir when there is a checkpoint); otherwise a radix tree.
func (d *daemon) openCache() {
	if mirrored(d.cfg.Engine) {
		d.mirror, d.restored = loadMirror(d.cfg, d.logger.With("component", "kvevents"))
		d.view = d.mirror
		return
	}
	d.tree = local.NewRadixTree(local.Options{})
	d.view = d.tree
}

// buildServers builds the NodeCache service over the cache, the gRPC server (NodeCache, health
// NOT_SERVING until ready, reflection) and the HTTP server (/metrics, /healthz, and whatever the
// engine mounts). The simulated engine's KV pool must see every reference its cache calls move,
// and a mirrored engine owns its cache, so then remote callers only read.
func (d *daemon) buildServers() error {
	var err error
	d.cacheSrv, err = node.New(d.view, node.Config{
		NodeID:    d.cfg.NodeID,
		BlockSize: d.cfg.BlockSize,
		Logger:    d.logger.With("component", "nodecache"),
		Registry:  d.reg,
		ReadOnly:  d.cfg.Engine == engineSim || mirrored(d.cfg.Engine),
		Owner:     cacheOwner(d.cfg.Engine),
	})
	if err != nil {
		return fmt.Errorf("node cache service: %w", err)
	}
	creds, err := serverCredentials(d.cfg)
	if err != nil {
		return err
	}
	if d.conns, err = connstats.New(d.reg); err != nil { // garbage connections counted, not logged
		return fmt.Errorf("connection metrics: %w", err)
	}
	d.grpcSrv = grpc.NewServer(append(d.cacheSrv.ServerOptions(), grpc.Creds(creds), grpc.StatsHandler(d.conns.StatsHandler()))...)
	d.cacheSrv.Register(d.grpcSrv)
	d.healthSrv = node.NewHealth(pb.NodeCache_ServiceDesc.ServiceName)
	healthpb.RegisterHealthServer(d.grpcSrv, d.healthSrv)
	reflection.Register(d.grpcSrv)

	d.mux = http.NewServeMux()
	d.mux.Handle("GET /metrics", promhttp.HandlerFor(d.reg, promhttp.HandlerOpts{Registry: d.reg}))
	d.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		if !d.ready.Load() {
			http.Error(w, "not serving", http.StatusServiceUnavailable)
			return
		}
		if reason := d.gossipOK.NotServing(); reason != "" {
			http.Error(w, "not serving: "+reason, http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	errLog, err := ratelog.ErrorLog(d.logger, d.reg) // counted, a few lines per interval
	if err != nil {
		return fmt.Errorf("http error log metrics: %w", err)
	}
	d.httpSrv = &http.Server{Handler: d.mux, ReadHeaderTimeout: readHeaderTimeout, IdleTimeout: idleTimeout, ErrorLog: errLog}
	return nil
}

// startEngine starts the engine side: the simulated engine, or the follower of a real engine's
// KV events. A mirrored engine named by its /v1/models is waited for under ctx, so a SIGTERM
// while the engine loads its weights stops the agent at once (errStoppedEarly). The engine gets
// a context of its own, cancelled only after the HTTP server has drained, so that in-flight
// completions finish.
func (d *daemon) startEngine(ctx context.Context) error {
	if err := resolveModel(ctx, &d.cfg, d.logger); err != nil {
		if ctx.Err() != nil {
			d.logger.Info("stopped while waiting for the engine", "cause", context.Cause(ctx))
			return errStoppedEarly
		}
		return fmt.Errorf("start engine: %w", err)
	}
	engineCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	if d.mirror != nil {
		d.ann = newAnnouncer(d.cacheSrv, d.logger.With("component", "kvevents"))
	}
	side, err := startEngine(engineCtx, &d.cfg, d.tree, d.mirror, d.restored, d.ann, d.logger, d.reg, d.mux)
	if err != nil {
		cancel()
		return fmt.Errorf("start engine: %w", err)
	}
	d.side, d.cancelEngine = side, cancel
	return nil
}

// listenAndJoin binds the gRPC and HTTP listeners, joins gossip (with --gossip-listen: this
// node's summary and load to the routers) and follows the pin table, holding this node's
// prefix pins in the tree. On an error it closes what it opened.
func (d *daemon) listenAndJoin(ctx context.Context) error {
	var err error
	if d.grpcLis, err = listen(d.cfg.GRPCListen); err != nil {
		return fmt.Errorf("grpc listen: %w", err)
	}
	if d.httpLis, err = net.Listen("tcp", d.cfg.HTTPListen); err != nil {
		_ = d.grpcLis.Close()
		return fmt.Errorf("http listen: %w", err)
	}
	d.agent, err = startGossip(ctx, d.cfg, d.view, d.cacheSrv.Epoch(), d.ann.cold(), d.grpcLis.Addr(), d.httpLis.Addr(), d.side.load, d.side.kvPeer, d.logger, d.reg)
	if err != nil {
		_ = d.grpcLis.Close()
		_ = d.httpLis.Close()
		return fmt.Errorf("gossip: %w", err)
	}
	if d.tree != nil {
		d.pinned, err = startPins(ctx, d.cfg, d.tree, d.agent, d.logger.With("component", "pins"), d.reg)
	} else {
		// A mirrored engine evicts on its own; the agent cannot hold its blocks.
		d.logger.Info("prefix pins are not held on a mirrored engine")
	}
	if err != nil {
		if d.agent != nil {
			_ = d.agent.Close(context.Background())
		}
		_ = d.grpcLis.Close()
		_ = d.httpLis.Close()
		return fmt.Errorf("pins: %w", err)
	}
	return nil
}

// serve starts both servers and writes the addresses; each server's exit arrives on the
// returned channel.
func (d *daemon) serve() chan error {
	served := make(chan error, 2)
	go func() { served <- serveErr("grpc", d.grpcSrv.Serve(d.conns.Listener(d.grpcLis))) }()
	go func() { served <- serveErr("http", d.httpSrv.Serve(d.httpLis)) }()
	addrs := append([]string{"grpc=" + addrString(d.grpcLis.Addr()), "http=" + d.httpLis.Addr().String()}, d.side.addrs...)
	if d.agent != nil {
		addrs = append(addrs, "gossip="+d.agent.GossipAddr()) // with --gossip-listen port 0, peers need it
	}
	if d.cfg.AddrFile != "" {
		if err := addrfile.Write(d.cfg.AddrFile, addrs...); err != nil {
			d.logger.Error("write addr file", "err", err)
		}
	}
	d.logger.Info("listening", "grpc", addrString(d.grpcLis.Addr()), "http", d.httpLis.Addr().String(),
		"node_id", d.cfg.NodeID, "epoch", fmt.Sprintf("%016x", d.cacheSrv.Epoch()), "engine", d.cfg.Engine, "role", d.cfg.Role,
		"kv_connector", d.kvConnectorLog(), "extra", strings.Join(d.side.addrs, " "))
	d.logListeners()
	return served
}

// kvConnectorLog is the connector as the start line names it: with SGLang's, its bootstrap port.
func (d *daemon) kvConnectorLog() string {
	_, conn, port := d.cfg.serving()
	if port != 0 {
		return fmt.Sprintf("%s (bootstrap port %d)", conn, port)
	}
	return conn.String()
}

// logListeners writes one line per open listener: its address, its protection and the flag (or
// the loopback address) that allowed it.
func (d *daemon) logListeners() {
	decisions, _ := exposure.CheckAll(d.cfg.listeners()) // newDaemon refused a failing one
	bound := []string{addrString(d.grpcLis.Addr()), d.httpLis.Addr().String()}
	for i, dec := range decisions {
		exposure.Log(d.logger, dec, bound[i])
	}
	if d.agent != nil {
		exposure.Log(d.logger, exposure.Gossip(d.agent.GossipAddr(), d.cfg.Gossip.KeyFile != ""), "")
	}
}

// followHealth makes the node SERVING. Its metadata is published by the gossip agent's Start;
// routers pull its summary on their own, so the node is ready as soon as it listens (beside a
// real engine: whenever that engine is healthy) and, with gossip, has joined; it is NOT_SERVING
// again while the engine is down or the node is isolated. Both watchers feed one verdict. The
// returned function stops the watchers and waits for them.
func (d *daemon) followHealth(ctx context.Context) (stop func()) {
	var verdictMu sync.Mutex // serializes verdicts, so the last one reads both inputs' latest
	applyHealth := func() {
		verdictMu.Lock()
		defer verdictMu.Unlock()
		d.healthSrv.SetServing(d.ready.Load() && d.gossipOK.NotServing() == "", pb.NodeCache_ServiceDesc.ServiceName)
	}
	healthCtx, stopHealth := context.WithCancel(ctx)
	engineDone := followHealth(healthCtx, d.side.healthy, &d.ready, applyHealth, d.logger)
	waitGossip := d.gossipOK.Follow(healthCtx, d.agent, func(cluster.Health) { applyHealth() }, d.logger.With("component", "gossip"))
	waitAnnounce := d.ann.start(healthCtx, d.agent)
	d.logger.Info("serving")
	return func() {
		stopHealth()
		<-engineDone
		waitGossip()
		waitAnnounce()
	}
}

// wait returns when ctx ends (SIGTERM) or a server dies on its own, with that server's error and
// how many servers have not yet returned.
func (d *daemon) wait(ctx context.Context, served <-chan error) (runErr error, pending int) {
	select {
	case <-ctx.Done():
		d.logger.Info("shutting down", "cause", context.Cause(ctx), "drain_timeout", d.cfg.DrainTimeout)
		return nil, 2
	case runErr = <-served: // drain the other one, then report it
		d.logger.Info("shutting down after a server failure", "drain_timeout", d.cfg.DrainTimeout)
		return runErr, 1
	}
}

// drainAll drains in reverse: stop advertising (health, then Draining to routers for the notice,
// then leave gossip), let calls finish within the deadline and cut, release the pins; the engine
// goes last (Run's deferred close) so that completions still being served can finish.
func (d *daemon) drainAll(stopHealth func()) {
	stopHealth()
	d.ready.Store(false)
	if d.agent != nil { // routers stop choosing this node, then it leaves the cluster
		announceDrain(d.agent, d.cfg.drainNotice(), d.logger)
		leaveCtx, cancelLeave := context.WithTimeout(context.Background(), d.cfg.DrainTimeout-d.cfg.drainNotice())
		if err := d.agent.Close(leaveCtx); err != nil {
			d.logger.Warn("gossip leave", "err", err)
		}
		cancelLeave()
	}
	drain(d.logger, d.cfg.DrainTimeout, d.healthSrv, d.grpcSrv, d.httpSrv)
	d.pinned.close() // releases the prefix pins' holds
	d.cancelEngine()
}

// cacheView is the node's cache as the NodeCache service and the gossip agent read it: a
// local.RadixTree, or a kvevents.CacheMirror of a real engine's cache.
type cacheView interface {
	node.Tree
	cluster.Source
}

var (
	_ cacheView = (*local.RadixTree)(nil)
	_ cacheView = (*kvevents.CacheMirror)(nil)
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
