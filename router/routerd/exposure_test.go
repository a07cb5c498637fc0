package routerd

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// A router that has not synced (its only seed never answers, and --sync-timeout 0 waits
// forever) answers 503 on vLLM's /health as on /healthz, and with --metrics-listen serves
// /metrics there and not beside the front door.
func TestHealthFollowsReadinessAndMetricsListen(t *testing.T) {
	dir := t.TempDir()
	addrFile := filepath.Join(dir, "addrs")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	var logs bytes.Buffer
	go func() {
		done <- Main(ctx, []string{"--grpc-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
			"--metrics-listen", "127.0.0.1:0", "--gossip-listen", "127.0.0.1:0", "--insecure-gossip",
			"--join", "127.0.0.1:1", "--sync-timeout", "0", "--node-id", "router-0",
			"--raft-listen", "127.0.0.1:0", "--raft-dir", filepath.Join(dir, "raft"),
			"--tokenizer", "bytes", "--addr-file", addrFile, "--log-level", "error"}, &logs, &logs)
	}()
	defer func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("serve did not stop within 30 s of cancellation")
		}
	}()
	addrs := waitAddrs(t, addrFile)
	get := func(addr, path string) (int, string) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, path := range []string{"/health", "/healthz"} {
		if code, body := get(addrs["http"], path); code != http.StatusServiceUnavailable || !strings.Contains(body, "not serving") {
			t.Errorf("GET %s on an unsynced router: %d %q, want 503 not serving", path, code, body)
		}
	}
	if addrs["metrics"] == "" {
		t.Fatalf("no metrics address in the addr file: %v", addrs)
	}
	if code, body := get(addrs["metrics"], "/metrics"); code != http.StatusOK || !strings.Contains(body, "prefixmesh_index_pairs") {
		t.Errorf("GET /metrics on --metrics-listen: %d, no prefixmesh_index_pairs", code)
	}
	if code, body := get(addrs["http"], "/metrics"); code == http.StatusOK && strings.Contains(body, "prefixmesh_index_pairs") {
		t.Errorf("GET /metrics on --http-listen still serves the registry with --metrics-listen set")
	}
}

// Without TLS, gRPC on an address other hosts reach is refused unless --insecure-grpc says so.
func TestPlaintextGRPCNeedsInsecureFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		ok   bool
	}{
		{[]string{}, true}, // the default listens on loopback
		{[]string{"--grpc-listen=127.0.0.1:7080"}, true},
		{[]string{"--grpc-listen=localhost:7080"}, true},
		{[]string{"--grpc-listen=[::1]:7080"}, true},
		{[]string{"--grpc-listen=:7080"}, false},
		{[]string{"--grpc-listen=0.0.0.0:7080"}, false},
		{[]string{"--grpc-listen=10.1.2.3:7080"}, false},
		{[]string{"--grpc-listen=:7080", "--insecure-grpc"}, true},
	} {
		var out, errb bytes.Buffer
		line := append([]string{"--validate-only", "--insecure-gossip"}, c.args...)
		code := Main(context.Background(), line, &out, &errb)
		if c.ok && code != 0 || !c.ok && (code != 2 || !strings.Contains(errb.String(), "--insecure-grpc")) {
			t.Errorf("%v: exit %d %q, want ok=%v", c.args, code, errb.String(), c.ok)
		}
	}
	if d := DefaultServeConfig(); strings.Contains(d.RaftDir, "data/raft") || !filepath.IsAbs(d.RaftDir) {
		t.Errorf("default --raft-dir %q: want an absolute state directory outside the working directory", d.RaftDir)
	}
}

// /healthz carries the plaintext-gRPC warning once, however many times it is asked, and only
// while the router serves.
func TestHealthzWarningIsStable(t *testing.T) {
	var ready atomic.Bool
	reason := ""
	h := healthHandler("ok\n", "gRPC serves without TLS", &ready, func() string { return reason })
	get := func() (int, string) {
		rec := httptest.NewRecorder()
		h(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		return rec.Code, rec.Body.String()
	}
	if code, _ := get(); code != http.StatusServiceUnavailable {
		t.Fatalf("unready: %d, want 503", code)
	}
	ready.Store(true)
	want := "ok\nwarning: gRPC serves without TLS\n"
	for i := range 3 {
		if code, body := get(); code != http.StatusOK || body != want {
			t.Fatalf("request %d: %d %q, want 200 %q", i, code, body, want)
		}
	}
	reason = "gossip isolated"
	if code, body := get(); code != http.StatusServiceUnavailable || !strings.Contains(body, "gossip isolated") {
		t.Fatalf("isolated: %d %q", code, body)
	}
}
