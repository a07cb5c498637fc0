package routerd

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// TestServeIsolatedGossipNotServing: a router whose seed answers nobody says so on /healthz
// (503 with the reason, even while it waits for pin store peers) and stays NOT_SERVING after its
// sync timeout.
func TestServeIsolatedGossipNotServing(t *testing.T) {
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	seed := dead.Addr().String()
	_ = dead.Close()
	dir := t.TempDir()
	addrFile := filepath.Join(dir, "addrs")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	var mu sync.Mutex
	var logs bytes.Buffer
	w := writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return logs.Write(p) })
	go func() {
		done <- Main(ctx, []string{"--grpc-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
			"--gossip-listen", "127.0.0.1:0", "--insecure-gossip", "--node-id", "router-0", "--join", seed,
			"--raft-listen", "", "--sync-timeout", "200ms", "--tokenizer", "bytes", "--addr-file", addrFile}, w, w)
	}()
	defer func() {
		cancel()
		select {
		case code := <-done:
			if code != 0 {
				mu.Lock()
				t.Errorf("serve exited %d: %s", code, logs.String())
				mu.Unlock()
			}
		case <-time.After(30 * time.Second):
			t.Error("serve did not stop within 30 s of cancellation")
		}
	}()
	addrs := waitAddrs(t, addrFile)
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get("http://" + addrs["http"] + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusServiceUnavailable && strings.Contains(string(body), "not joined") && strings.Contains(string(body), seed) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthz = %d %q", resp.StatusCode, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cc, err := grpc.NewClient(addrs["grpc"], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	// Past the sync timeout a router that ignored gossip health would serve; it must not while isolated.
	for end := time.Now().Add(time.Second); time.Now().Before(end); {
		h, err := healthpb.NewHealthClient(cc).Check(context.Background(), &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
		if err != nil {
			t.Fatal(err)
		}
		if h.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Fatalf("isolated router reports %v", h.GetStatus())
		}
		time.Sleep(50 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "gossip join failed") {
		t.Fatalf("no WARN for the failed join:\n%s", logs.String())
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
