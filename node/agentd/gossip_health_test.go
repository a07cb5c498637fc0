package agentd

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
)

// TestRunIsolatedGossipNotServing: a node agent whose seeds answer nobody reports NOT_SERVING
// on grpc health and 503 with the reason on /healthz, logs at WARN and exports the isolation
// (it used to report healthy and log at DEBUG).
func TestRunIsolatedGossipNotServing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	seed := dead.Addr().String()
	_ = dead.Close() // a seed nobody answers at

	cfg := DefaultConfig()
	cfg.GRPCListen = "127.0.0.1:0"
	cfg.HTTPListen = "127.0.0.1:0"
	cfg.NodeID = "island"
	cfg.KVBlocks = 1024
	cfg.Gossip.Listen = "127.0.0.1:0"
	cfg.Gossip.Insecure = true
	cfg.Gossip.Join = []string{seed}
	cfg.AddrFile = filepath.Join(t.TempDir(), "addrs")
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	logs := newLogWatcher()
	done := make(chan error, 1)
	go func() { done <- Run(runCtx, cfg, logs) }()
	grpcAddr, httpAddr := logs.waitAddrs(t)

	deadline := time.Now().Add(testTimeout)
	for {
		code, body := httpGet(t, ctx, "http://"+httpAddr+"/healthz")
		if code == http.StatusServiceUnavailable && strings.Contains(body, "not joined") && strings.Contains(body, seed) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthz = %d %q; log:\n%s", code, body, logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	conn := dial(t, grpcAddr)
	for _, svc := range []string{"", pb.NodeCache_ServiceDesc.ServiceName} {
		r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Fatalf("health %q = %v, %v; want NOT_SERVING", svc, r, err)
		}
	}
	if _, body := httpGet(t, ctx, "http://"+httpAddr+"/metrics"); !strings.Contains(body, "prefixmesh_gossip_isolated 1") ||
		!strings.Contains(body, `prefixmesh_gossip_members{role="node"} 1`) {
		t.Fatalf("metrics lack the isolation gauge or member counts")
	}
	for !strings.Contains(logs.String(), "level=WARN msg=\"gossip join failed") {
		if time.Now().After(deadline) {
			t.Fatalf("no WARN for the failed join; log:\n%s", logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("run = %v", err)
	}
}
