// Package routerd is the router daemon's life (`prefixmesh-router serve`), importable so that
// cmd/router and the one-process demo run the same code. It joins the gossip cluster and mirrors
// every node's cache summary into the routing index; keeps the Raft-replicated pin table as a
// voter (or follows a voter's); and serves its three doors over one request service
// (router/requests): the OpenAI-compatible front door (router/frontdoor) beside /metrics and
// /healthz on HTTP, Router.Route (with Pins, grpc.health.v1 and reflection) on gRPC, and with
// --ext-proc-listen the gateway's endpoint picker (router/extproc). Every door reads placement
// pins locally, so a router without Raft quorum keeps routing. config_serve.go holds the flags,
// serve.go the lifecycle, serve_pins.go the pin plane (store, bootstrap, reconcile with gossip
// membership, follower), serve_http.go the request service, the front door and the HTTP mux,
// serve_extproc.go the endpoint picker, serve_tls.go the TLS configurations.
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
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/prefixmesh/prefixmesh/cluster"
	"github.com/prefixmesh/prefixmesh/cluster/pins"
	"github.com/prefixmesh/prefixmesh/internal/addrfile"
	"github.com/prefixmesh/prefixmesh/internal/connstats"
	"github.com/prefixmesh/prefixmesh/internal/exposure"
	"github.com/prefixmesh/prefixmesh/internal/shutdown"
	"github.com/prefixmesh/prefixmesh/internal/tokenizer"
	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
	"github.com/prefixmesh/prefixmesh/router"
	"github.com/prefixmesh/prefixmesh/router/directory"
	"github.com/prefixmesh/prefixmesh/router/flow"
	"github.com/prefixmesh/prefixmesh/router/peershare"
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

// Run is the router's life, in phases: listen, start the pin plane, build the gossip mirror and
// the one decision path with its three doors (gRPC Route, the HTTP front door, the gateway's
// endpoint picker), join and serve with health NOT_SERVING until the mirror has synced every
// node it knows, and on ctx's end drain in reverse within DrainTimeout: NOT_SERVING, the front
// door finishes its streams, the pin plane stops reconciling, the router leaves gossip, the
// Raft leader hands over, the servers stop. A phase that fails undoes what earlier ones started.
func Run(ctx context.Context, cfg ServeConfig, stderr io.Writer) error {
	d, err := newRouterd(cfg, stderr)
	if err != nil {
		return err
	}
	defer d.undoStart()
	defer d.fetcher.Close()
	if err := d.startTracing(ctx); err != nil {
		return err
	}
	if err := d.listen(); err != nil {
		return err
	}
	if err := d.startPinPlane(ctx, stderr); err != nil {
		return err
	}
	if err := d.buildMirror(); err != nil {
		return err
	}
	if err := d.buildDecisionPath(); err != nil {
		return err
	}
	if err := d.buildDoors(ctx); err != nil {
		return err
	}
	waitCtx, stopWait := context.WithCancel(ctx)
	defer stopWait()
	if err := d.joinAndServe(ctx, waitCtx, stopWait); err != nil {
		return err
	}
	if err := d.servePins(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // stopped while waiting for peers: nothing was served
		}
		return err
	}
	d.undo = nil // from here on, drain stops everything
	d.followSync(waitCtx)
	runErr := d.wait(ctx)
	stopWait()
	return d.drain(runErr)
}

// routerd is one run of the router daemon: what each phase of Run builds and a later one uses.
type routerd struct {
	cfg    ServeConfig
	logger *slog.Logger
	reg    *prometheus.Registry
	tls    tlsSetup
	undo   []func() // until the router serves: on a failed or cancelled start, in reverse

	// tracing (serve_tracing.go): the doors' provider, no-op unless the environment turns it on
	tracer      trace.TracerProvider
	stopTracing func(context.Context) error

	// listen
	grpcLis, httpLis, metricsLis net.Listener
	grpcAddr                     string // announced in gossip and to the pin store
	plaintext                    string // why /healthz warns, when gRPC is plaintext on the network

	plane   *pinPlane
	idx     *routing.Index
	fetcher *cluster.GRPCFetcher
	agent   *cluster.Agent

	// the decision path and gRPC
	decider  *routing.Decider
	sharer   *peershare.Sharer
	tokenize pins.TokenizeFunc
	conns    *connstats.Counter
	grpcSrv  *grpc.Server
	health   *health.Server

	// the HTTP doors
	fd         *frontDoor
	epp        *endpointPicker
	ready      atomic.Bool
	state      *servingState
	httpSrv    *http.Server
	metricsSrv *http.Server

	served     chan error // each server's exit
	pending    int        // servers whose exit the drain waits for
	waitGossip func()
	waiters    sync.WaitGroup
}

func newRouterd(cfg ServeConfig, stderr io.Writer) (*routerd, error) {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel)) // validated
	d := &routerd{cfg: cfg, logger: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})),
		reg: prometheus.NewRegistry(), served: make(chan error, 4)} // http, metrics, grpc, ext-proc
	d.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// The listener rule again, for callers of Run that did not validate: no listener opens
	// against it.
	if _, err := exposure.CheckAll(cfg.listeners()); err != nil {
		return nil, err
	}
	var err error
	if d.tls, err = loadTLS(cfg); err != nil {
		return nil, err
	}
	d.fetcher = cluster.NewGRPCFetcher(d.tls.dialOption())
	return d, nil
}

// onFail registers what undoes a step, should a later one fail before the router serves.
func (d *routerd) onFail(f func()) { d.undo = append(d.undo, f) }

func (d *routerd) undoStart() {
	for i := len(d.undo) - 1; i >= 0; i-- {
		d.undo[i]()
	}
}

// listen binds first: the gRPC address goes into the gossip metadata and the pin store.
func (d *routerd) listen() error {
	var err error
	if d.grpcLis, err = net.Listen("tcp", d.cfg.GRPCListen); err != nil {
		return fmt.Errorf("grpc listen: %w", err)
	}
	d.onFail(func() { _ = d.grpcLis.Close() })
	if d.httpLis, err = net.Listen("tcp", d.cfg.HTTPListen); err != nil {
		return fmt.Errorf("http listen: %w", err)
	}
	d.onFail(func() { _ = d.httpLis.Close() })
	if d.cfg.MetricsListen != "" {
		if d.metricsLis, err = net.Listen("tcp", d.cfg.MetricsListen); err != nil {
			return fmt.Errorf("metrics listen: %w", err)
		}
		d.onFail(func() { _ = d.metricsLis.Close() })
	}
	if d.cfg.plaintextGRPC() {
		d.plaintext = "gRPC (pin writes, Raft proposals) serves without TLS on " + d.grpcLis.Addr().String()
		d.logger.Warn("plaintext gRPC on a non-loopback address (--insecure-grpc): anyone who reaches it can change pins", "grpc", d.grpcLis.Addr().String())
		plaintextGauge := prometheus.NewGauge(prometheus.GaugeOpts{Name: "prefixmesh_router_grpc_plaintext",
			Help: "1 when gRPC serves without TLS on a non-loopback address (--insecure-grpc)."})
		plaintextGauge.Set(1)
		d.reg.MustRegister(plaintextGauge)
	}
	d.grpcAddr = d.cfg.GRPCAdvertise
	if d.grpcAddr == "" {
		// Peers dial this address: a wildcard bind (":7070", as in Kubernetes) is announced with
		// the gossip advertise host or this host's first private address, never "[::]".
		d.grpcAddr = cluster.ReachableAddr(d.grpcLis.Addr(), advertiseHost(d.cfg.Gossip.Advertise))
	}
	return nil
}

// startPinPlane starts a Raft voter here when it needs no peers, so that its Raft address can go
// into the gossip metadata.
func (d *routerd) startPinPlane(ctx context.Context, stderr io.Writer) error {
	var err error
	d.plane, err = newPinPlane(ctx, d.cfg, d.grpcAddr, advertiseHost(d.cfg.Gossip.Advertise), d.tls, d.reg,
		d.logger.With("component", "pins"), stderr)
	if err != nil {
		return err
	}
	d.onFail(func() { _ = d.plane.shutdown(context.Background()) })
	return nil
}

// buildMirror builds the summary index and the gossip agent that feeds it.
func (d *routerd) buildMirror() error {
	icfg := routing.DefaultIndexConfig()
	icfg.MaxBytes = d.cfg.IndexMaxBytes
	d.idx = routing.NewIndex(icfg)
	gcfg := cluster.DefaultConfig(cluster.RoleRouter, d.cfg.NodeID)
	if err := d.cfg.Gossip.Apply(&gcfg); err != nil {
		return err
	}
	gcfg.Meta.GRPCAddr = d.grpcAddr
	gcfg.Meta.RaftAddr = d.plane.raftAddr
	gcfg.Logger = d.logger.With("component", "gossip")
	gcfg.Registry = d.reg
	var err error
	d.agent, err = cluster.New(gcfg, cluster.Deps{Index: d.idx, Fetcher: d.fetcher})
	return err
}

// buildDecisionPath builds the one decision path of every door (the same policy instance,
// overlay and in-flight counts, whichever door a request comes through), the sharing of its
// decisions with the other routers, the request service and the front door on it, and the gRPC
// server with Route, Pins and health (NOT_SERVING until the mirror has synced).
func (d *routerd) buildDecisionPath() error {
	pol, err := routing.NewPolicy(d.cfg.Policy, d.cfg.policyConfig())
	if err != nil {
		return err
	}
	if d.decider, err = routing.NewDecider(d.idx, routing.NewOverlay(0, 0), pol, routing.DeciderConfig{}); err != nil {
		return err
	}
	if err = d.reg.Register(router.NewTTFTCollector(d.decider)); err != nil {
		return err
	}
	if d.sharer, err = peershare.New(peershare.DefaultConfig(d.cfg.NodeID), d.decider, d.agent, d.reg); err != nil {
		return err
	}
	// Flow control, one for the three doors, on the decisions' own view and in-flight counts.
	var fc *flow.Controller
	flowSrc := &router.FlowSource{View: router.NewView(d.agent.Mirror(), d.idx), Decider: d.decider}
	if d.cfg.FlowControl {
		fcfg, err := d.cfg.flowConfig() // validated
		if err != nil {
			return err
		}
		if fc, err = flow.New(fcfg, flowSrc, d.reg); err != nil {
			return err
		}
	}
	// The request service (and the front door over it) first, so that Route leaves out the
	// nodes its passive health ejects, as the other doors do.
	if d.fd, err = newFrontDoor(d.cfg, d.tls, d.agent.Mirror(), d.idx, d.decider, d.plane.table, fc, d.tracer, d.reg, d.logger.With("component", "frontdoor")); err != nil {
		return err
	}
	flowSrc.Ejected = d.fd.Health.Ejected // before anything is served
	// What the router sees of each node and what its decisions expect to reuse, at every scrape
	// (the dashboard's per-node panels and `prefixmesh-router status` read these).
	if err = d.reg.Register(router.NewFleetCollector(router.FleetSource{Mirror: d.agent.Mirror(), Blocks: d.idx.NodeState,
		Ejected: d.fd.Health.Ejected, Decider: d.decider})); err != nil {
		return err
	}
	rcfg := router.DefaultConfig()
	rcfg.Ejector = d.fd.Health
	rcfg.Policy = d.cfg.Policy
	rcfg.PolicyConfig = d.cfg.policyConfig()
	rcfg.Pins = d.plane.table
	rcfg.Decider = d.decider
	rcfg.TracerProvider = d.tracer
	rcfg.Disaggregate, _ = routing.ParseDisaggMode(d.cfg.Disaggregate) // validated
	if fc != nil {
		rcfg.Flow = fc
	}
	if tok, err := tokenizer.New(d.cfg.Tokenizer); err == nil { // engine and none: token ids only
		rcfg.Tokenizer = tok
		d.tokenize = func(text string) ([]uint32, error) { return tokenizer.EncodePrompt(context.Background(), tok, text) }
	}
	routeSrv, err := router.NewServer(router.NewView(d.agent.Mirror(), d.idx), rcfg, d.reg)
	if err != nil {
		return err
	}
	if d.conns, err = connstats.New(d.reg); err != nil { // garbage connections counted, not logged
		return err
	}
	d.grpcSrv = grpc.NewServer(grpc.Creds(d.tls.grpcServerCreds()), grpc.ChainStreamInterceptor(d.plane.streamGate),
		grpc.StatsHandler(d.conns.StatsHandler()))
	routeSrv.Register(d.grpcSrv)
	pb.RegisterDirectoryServer(d.grpcSrv, directory.NewGRPC(d.fd.Directory))
	d.health = health.NewServer()
	d.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	d.health.SetServingStatus(pb.Router_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_NOT_SERVING)
	d.health.SetServingStatus(pb.Directory_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(d.grpcSrv, d.health)
	reflection.Register(d.grpcSrv)
	return nil
}

// buildDoors builds the HTTP server of the front door (beside /metrics and /healthz) and, with
// --ext-proc-listen, the inference gateway's endpoint picker over the same request service.
func (d *routerd) buildDoors(ctx context.Context) error {
	var err error
	if d.epp, err = newEndpointPicker(d.cfg, d.fd, d.agent.Mirror(), d.conns, d.tracer, d.reg, d.logger.With("component", "extproc")); err != nil {
		return err
	}
	d.state = &servingState{h: d.health, ready: &d.ready, agent: d.agent, logger: d.logger}
	if d.epp != nil {
		d.onFail(func() { d.epp.srv.Stop(); _ = d.epp.lis.Close() })
		d.state.onServing = d.epp.epp.SetReady
	}
	d.httpSrv = httpServer(ctx, d.fd, d.reg, d.metricsLis == nil, &d.ready, d.state.gate.NotServing, d.plaintext, d.logger)
	if d.metricsLis != nil {
		d.metricsSrv = metricsServer(d.reg, d.tls.metrics)
	}
	return nil
}

// joinAndServe joins gossip, starts sharing and the front door, serves HTTP (health follows
// gossip from here on: a router stuck waiting for pin store peers says why on /healthz), and
// writes the addresses.
func (d *routerd) joinAndServe(ctx, waitCtx context.Context, stopWait func()) error {
	if err := d.agent.Start(ctx); err != nil {
		return err
	}
	d.onFail(func() { _ = d.agent.Close(context.Background()) })
	d.sharer.Start(ctx)
	d.onFail(d.sharer.Close)
	d.fd.start(ctx)
	d.onFail(func() { _ = d.fd.Shutdown(context.Background()) })
	go func() { d.served <- serveErr("http", serveHTTP(d.httpSrv, d.httpLis)) }()
	d.onFail(func() { _ = d.httpSrv.Close(); <-d.served })
	d.pending = 2 // http and grpc
	if d.metricsSrv != nil {
		go func() { d.served <- serveErr("metrics", serveHTTP(d.metricsSrv, d.metricsLis)) }()
		d.onFail(func() { _ = d.metricsSrv.Close(); <-d.served })
		d.pending++
	}
	d.waitGossip = d.state.follow(waitCtx)
	d.onFail(func() { stopWait(); d.waitGossip(); d.waiters.Wait() })
	raftAddr := d.plane.raftAddr
	if raftAddr == "" {
		raftAddr = "-"
	}
	// Listening: gRPC calls that arrive before Serve (servePins) wait in the listen backlog.
	addrs := []string{"grpc=" + d.grpcLis.Addr().String(), "http=" + d.httpLis.Addr().String(), "gossip=" + d.agent.GossipAddr(), "raft=" + raftAddr}
	if d.metricsLis != nil {
		addrs = append(addrs, "metrics="+d.metricsLis.Addr().String())
	}
	if d.epp != nil {
		addrs = append(addrs, "extproc="+d.epp.addr())
	}
	if d.cfg.AddrFile != "" {
		if err := addrfile.Write(d.cfg.AddrFile, addrs...); err != nil {
			d.logger.Error("write addr file", "err", err)
		}
	}
	d.logger.Info("listening", "grpc", d.grpcLis.Addr().String(), "http", d.httpLis.Addr().String(),
		"gossip", d.agent.GossipAddr(), "raft", d.plane.raftAddr, "node_id", d.cfg.NodeID, "policy", d.cfg.Policy)
	d.logListeners()
	return nil
}

// logListeners writes one line per open listener: its address, its protection and the flag (or
// the loopback address) that allowed it, so that a production log shows what each port exposes.
func (d *routerd) logListeners() {
	bound := map[string]string{"--grpc-listen": d.grpcLis.Addr().String(), "--http-listen": d.httpLis.Addr().String()}
	if d.metricsLis != nil {
		bound["--metrics-listen"] = d.metricsLis.Addr().String()
	}
	if d.epp != nil {
		bound["--ext-proc-listen"] = d.epp.addr()
	}
	decisions, _ := exposure.CheckAll(d.cfg.listeners()) // newRouterd refused a failing one
	for _, dec := range decisions {
		exposure.Log(d.logger, dec, bound[dec.ListenFlag]) // Raft: the configured address
	}
	exposure.Log(d.logger, exposure.Gossip(d.agent.GossipAddr(), d.cfg.Gossip.KeyFile != ""), "")
}

// servePins starts the pin store once its bootstrap peers are known, then serves gRPC (and the
// endpoint picker).
func (d *routerd) servePins(ctx context.Context) error {
	if err := d.plane.awaitBootstrap(ctx, d.agent); err != nil {
		return err
	}
	d.plane.register(d.grpcSrv, d.tokenize)
	d.plane.start(ctx, d.agent)
	go func() { d.served <- serveErr("grpc", d.grpcSrv.Serve(d.conns.Listener(d.grpcLis))) }()
	if d.epp != nil {
		d.epp.serve(d.served)
		d.pending++
	}
	return nil
}

// followSync makes the router SERVING once every node it knows has been synced (and, with
// seeds, once it knows someone); it is NOT_SERVING whenever gossip is isolated afterwards.
func (d *routerd) followSync(waitCtx context.Context) {
	d.waiters.Go(func() {
		awaitSync(waitCtx, d.cfg, d.agent, d.logger)
		if waitCtx.Err() == nil {
			d.state.markSynced()
		}
	})
}

// wait returns when ctx ends, or with the error of a server that died on its own.
func (d *routerd) wait(ctx context.Context) error {
	select {
	case <-ctx.Done():
		d.logger.Info("shutting down", "drain_timeout", d.cfg.DrainTimeout)
		return nil
	case err := <-d.served:
		d.pending--
		d.logger.Error("server failed", "err", err)
		return err
	}
}

// drain stops everything in reverse, all within DrainTimeout, and returns runErr or the first
// error a server reported while stopping.
func (d *routerd) drain(runErr error) error {
	d.waitGossip()
	d.waiters.Wait()
	d.ready.Store(false)
	d.health.Shutdown() // NOT_SERVING, and health Watch streams end
	drainCtx, cancel := context.WithTimeout(context.Background(), d.cfg.DrainTimeout)
	defer cancel()
	if err := d.fd.Shutdown(drainCtx); err != nil {
		d.logger.Warn("front door drain incomplete", "err", err)
	}
	if d.epp != nil {
		d.epp.shutdown(drainCtx, d.logger)
	}
	d.plane.stopLoop() // no reconcile against a membership we are leaving
	d.sharer.Close()   // the front door is drained: nothing left to tell the other routers
	if err := d.agent.Close(drainCtx); err != nil {
		d.logger.Warn("gossip leave", "err", err)
	}
	if err := d.plane.shutdown(drainCtx); err != nil { // the leader hands over first
		d.logger.Warn("pin store shutdown", "err", err)
	}
	httpSrvs := []*http.Server{d.httpSrv}
	if d.metricsSrv != nil {
		httpSrvs = append(httpSrvs, d.metricsSrv)
	}
	shutdown.Servers(drainCtx, d.logger, d.grpcSrv, httpSrvs...)
	for ; d.pending > 0; d.pending-- {
		if err := <-d.served; err != nil && runErr == nil {
			runErr = err
		}
	}
	d.flushTracing() // every door has stopped: no span is left to end
	d.logger.Info("stopped")
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
