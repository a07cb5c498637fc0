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
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/prefixmesh/prefixmesh/cluster"
	"github.com/prefixmesh/prefixmesh/internal/tokenizer"
	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
	"github.com/prefixmesh/prefixmesh/router"
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
// the mirror has synced every node it knows, serve, and on ctx's end leave the cluster and drain
// in reverse within DrainTimeout.
func Run(ctx context.Context, cfg ServeConfig, stderr io.Writer) error {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel)) // validated
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	// 1. Listen first: the gRPC address goes into our gossip metadata.
	grpcLis, err := net.Listen("tcp", cfg.GRPCListen)
	if err != nil {
		return fmt.Errorf("grpc listen: %w", err)
	}
	httpLis, err := net.Listen("tcp", cfg.HTTPListen)
	if err != nil {
		_ = grpcLis.Close()
		return fmt.Errorf("http listen: %w", err)
	}

	// 2. The summary index and the gossip agent that feeds it.
	idx := routing.NewIndex(routing.DefaultIndexConfig())
	fetcher := cluster.NewGRPCFetcher()
	defer fetcher.Close()
	gcfg := cluster.DefaultConfig(cluster.RoleRouter, cfg.NodeID)
	if err := cfg.Gossip.Apply(&gcfg); err != nil {
		return err
	}
	gcfg.Meta.GRPCAddr = cfg.GRPCAdvertise
	if gcfg.Meta.GRPCAddr == "" {
		gcfg.Meta.GRPCAddr = grpcLis.Addr().String()
	}
	gcfg.Logger = logger.With("component", "gossip")
	gcfg.Registry = reg
	agent, err := cluster.New(gcfg, cluster.Deps{Index: idx, Fetcher: fetcher})
	if err != nil {
		return err
	}

	// 3. The Route service over the view of mirror + index.
	rcfg := router.DefaultConfig()
	rcfg.Policy = cfg.Policy
	if cfg.Tokenizer != "none" {
		tok, err := tokenizer.New(cfg.Tokenizer)
		if err != nil {
			return fmt.Errorf("--tokenizer: %w", err)
		}
		rcfg.Tokenizer = tok
	}
	routeSrv, err := router.NewServer(router.NewView(agent.Mirror(), idx), rcfg, reg)
	if err != nil {
		return err
	}
	grpcSrv := grpc.NewServer()
	routeSrv.Register(grpcSrv)
	healthSrv := health.NewServer()
	healthSrv.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	healthSrv.SetServingStatus(pb.Router_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(grpcSrv, healthSrv)
	reflection.Register(grpcSrv)

	ready := make(chan struct{})
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		select {
		case <-ready:
			_, _ = io.WriteString(w, "ok\n")
		default:
			http.Error(w, "not serving: mirror not synced", http.StatusServiceUnavailable)
		}
	})
	httpSrv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)}

	// 4. Join and serve.
	if err := agent.Start(ctx); err != nil {
		_ = grpcLis.Close()
		_ = httpLis.Close()
		return err
	}
	served := make(chan error, 2)
	go func() { served <- serveErr("grpc", grpcSrv.Serve(grpcLis)) }()
	go func() { served <- serveErr("http", httpSrv.Serve(httpLis)) }()
	addrs := fmt.Sprintf("grpc=%s http=%s gossip=%s", grpcLis.Addr(), httpLis.Addr(), agent.GossipAddr())
	if cfg.AddrFile != "" {
		if err := os.WriteFile(cfg.AddrFile, []byte(addrs+"\n"), 0o644); err != nil {
			logger.Error("write addr file", "err", err)
		}
	}
	logger.Info("listening", "grpc", grpcLis.Addr().String(), "http", httpLis.Addr().String(),
		"gossip", agent.GossipAddr(), "node_id", cfg.NodeID, "policy", cfg.Policy)

	// 5. SERVING once every node we know has been synced (and, with seeds, once we know someone).
	waitCtx, stopWait := context.WithCancel(ctx)
	defer stopWait()
	go func() {
		t := time.NewTicker(syncPoll)
		defer t.Stop()
		start := time.Now()
		for {
			synced := agent.Mirror().Synced() && (len(cfg.Gossip.Join) == 0 || len(agent.Members()) > 1)
			if synced || (cfg.SyncTimeout > 0 && time.Since(start) > cfg.SyncTimeout) {
				if !synced {
					var missing []string
					for _, n := range agent.Mirror().Nodes() {
						if !n.Synced {
							missing = append(missing, n.Meta.NodeID)
						}
					}
					logger.Warn("serving before every node synced", "sync_timeout", cfg.SyncTimeout, "unsynced", missing)
				}
				healthSrv.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
				healthSrv.SetServingStatus(pb.Router_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
				close(ready)
				logger.Info("serving", "nodes", len(agent.Mirror().Nodes()))
				return
			}
			select {
			case <-waitCtx.Done():
				return
			case <-t.C:
			}
		}
	}()

	var runErr error
	pending := 2
	select {
	case <-ctx.Done():
		logger.Info("shutting down", "drain_timeout", cfg.DrainTimeout)
	case runErr = <-served:
		pending--
		logger.Error("server failed", "err", runErr)
	}

	// 6. Drain in reverse: NOT_SERVING, leave gossip, finish calls within the deadline.
	stopWait()
	healthSrv.Shutdown()
	drainCtx, cancel := context.WithTimeout(context.Background(), cfg.DrainTimeout)
	defer cancel()
	if err := agent.Close(drainCtx); err != nil {
		logger.Warn("gossip leave", "err", err)
	}
	grpcDone := make(chan struct{})
	go func() {
		grpcSrv.GracefulStop()
		close(grpcDone)
	}()
	if err := httpSrv.Shutdown(drainCtx); err != nil {
		_ = httpSrv.Close()
	}
	select {
	case <-grpcDone:
	case <-drainCtx.Done():
		grpcSrv.Stop()
		<-grpcDone
	}
	for ; pending > 0; pending-- {
		if err := <-served; err != nil && runErr == nil {
			runErr = err
		}
	}
	logger.Info("stopped")
	return runErr
}

// serveErr reports a server's exit: nil for a requested stop, else the error with its name.
func serveErr(name string, err error) error {
	if err == nil || errors.Is(err, http.ErrServerClosed) || errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	return fmt.Errorf("%s serve: %w", name, err)
}
