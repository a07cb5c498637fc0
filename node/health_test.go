package node

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// TestHealthDrainEndsWatch checks that a watcher sees NOT_SERVING → SERVING → NOT_SERVING and
// then a clean end of stream on Drain, and that GracefulStop is then not held up by it.
func TestHealthDrainEndsWatch(t *testing.T) {
	const svc = "prefixmesh.v1.NodeCache"
	h := NewHealth(svc)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	healthpb.RegisterHealthServer(g, h)
	served := make(chan error, 1)
	go func() { served <- g.Serve(lis) }()
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := testCtx(t)
	stream, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{Service: svc})
	if err != nil {
		t.Fatal(err)
	}
	expect := func(want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		r, err := stream.Recv()
		if err != nil || r.GetStatus() != want {
			t.Fatalf("Recv = %v, %v; want %v", r, err, want)
		}
	}
	expect(healthpb.HealthCheckResponse_NOT_SERVING)
	h.SetServing(true, svc)
	expect(healthpb.HealthCheckResponse_SERVING)
	h.Drain()
	expect(healthpb.HealthCheckResponse_NOT_SERVING)
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the final NOT_SERVING: %v, want a clean end of stream", err)
	}
	stopped := make(chan struct{})
	go func() { g.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(testTimeout):
		t.Fatal("GracefulStop still waiting after Drain")
	}
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	h.SetServing(true, svc) // ignored after Drain
	if r, err := h.Check(ctx, &healthpb.HealthCheckRequest{Service: svc}); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("Check after Drain = %v, %v; want NOT_SERVING", r, err)
	}
}
