package connstats

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func value(c prometheus.Counter) float64 {
	var m dto.Metric
	_ = c.Write(&m)
	return m.GetCounter().GetValue()
}

// TestCountsGarbageAndRealConnections: garbage connections are refused and counted, a real
// client's connection is established, and nothing is left pending.
func TestCountsGarbageAndRealConnections(t *testing.T) {
	c, err := New(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.StatsHandler(c.StatsHandler()))
	healthpb.RegisterHealthServer(gs, health.NewServer())
	go func() { _ = gs.Serve(c.Listener(lis)) }()
	defer gs.Stop()

	const garbage = 20
	for i := 0; i < garbage; i++ {
		conn, err := net.Dial("tcp", lis.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		_, _ = conn.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n garbage that is not an HTTP/2 preface"))
		_ = conn.Close()
	}
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for value(c.refused) < garbage || value(c.established) < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("accepted %v, established %v, refused %v", value(c.accepted), value(c.established), value(c.refused))
		}
		time.Sleep(5 * time.Millisecond)
	}
	if a := value(c.accepted); a != garbage+1 {
		t.Fatalf("accepted %v, want %d", a, garbage+1)
	}
	c.mu.Lock()
	n := len(c.pending)
	c.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d connections left pending", n)
	}
}
