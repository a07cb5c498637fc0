package agentd

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prefixmesh/prefixmesh/internal/testcerts"
)

// TestListenerRule checks the router's rule on the node agent's listeners with non-loopback
// addresses, validating only (nothing listens): NodeCache (whose Insert/Evict/Release can free
// blocks an engine uses) in plaintext needs --insecure-grpc, over TLS a client CA or
// --tls-no-client-auth; the HTTP listener has no TLS and needs --insecure-http off loopback.
func TestListenerRule(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, dir, "ca")
	cert, key := ca.Issue(t, "node")
	tls := []string{"--tls-cert=" + cert, "--tls-key=" + key}
	for _, c := range []struct {
		name string
		args []string
		want string // "" accepted; else a flag the refusal must name
	}{
		{"defaults (loopback)", nil, ""},
		{"NodeCache plaintext", []string{"--grpc-listen=10.0.0.1:7070"}, "--insecure-grpc"},
		{"NodeCache plaintext on a wildcard", []string{"--grpc-listen=:7070"}, "--insecure-grpc"},
		{"NodeCache plaintext, insecure flag", []string{"--grpc-listen=10.0.0.1:7070", "--insecure-grpc"}, ""},
		{"NodeCache TLS without client CA", append([]string{"--grpc-listen=10.0.0.1:7070"}, tls...), "--tls-no-client-auth"},
		{"NodeCache TLS, no-client-auth flag", append([]string{"--grpc-listen=10.0.0.1:7070", "--tls-no-client-auth"}, tls...), ""},
		{"NodeCache mTLS", append([]string{"--grpc-listen=10.0.0.1:7070", "--tls-client-ca=" + ca.File}, tls...), ""},
		{"NodeCache on a unix socket", []string{"--grpc-listen=unix://" + filepath.Join(dir, "nodecache.sock")}, ""},
		{"HTTP plaintext", []string{"--http-listen=10.0.0.1:8080"}, "--insecure-http"},
		{"HTTP plaintext, insecure flag", []string{"--http-listen=10.0.0.1:8080", "--insecure-http"}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := agentMain(append([]string{"--validate-only"}, c.args...), &out, &errb)
			switch {
			case c.want == "" && code != 0:
				t.Errorf("%v: exit %d %q, want accepted", c.args, code, errb.String())
			case c.want != "" && (code != 2 || !strings.Contains(errb.String(), c.want)):
				t.Errorf("%v: exit %d %q, want refused naming %s", c.args, code, errb.String(), c.want)
			}
		})
	}
}

// lockedBuffer is a bytes.Buffer the agent's goroutines may write while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *lockedBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *lockedBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestListenerLog starts an agent with mTLS on NodeCache and checks that the start-up log names
// each listener, its protection and what allowed it.
func TestListenerLog(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, dir, "ca")
	cert, key := ca.Issue(t, "node")
	addrFile := filepath.Join(dir, "addrs")
	ctx, cancel := context.WithCancel(context.Background())
	logs := &lockedBuffer{}
	done := make(chan int, 1)
	go func() {
		done <- Main(ctx, []string{"--grpc-listen=127.0.0.1:0", "--http-listen=127.0.0.1:0", "--kv-blocks=64",
			"--tls-cert=" + cert, "--tls-key=" + key, "--tls-client-ca=" + ca.File, "--addr-file=" + addrFile}, logs, logs)
	}()
	deadline := time.NewTimer(testTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !strings.Contains(logs.String(), `listener="HTTP (/metrics, /healthz`) {
		select {
		case code := <-done:
			t.Fatalf("agent exited %d before listening:\n%s", code, logs.String())
		case <-deadline.C:
			t.Fatalf("no listener lines within %v:\n%s", testTimeout, logs.String())
		case <-tick.C:
		}
	}
	cancel()
	select {
	case <-done:
	case <-time.After(testTimeout):
		t.Fatalf("agent did not stop within %v", testTimeout)
	}
	out := logs.String()
	for _, want := range []string{`listener="NodeCache gRPC"`, `protection=mTLS allowed_by=--tls-client-ca`,
		`protection=plaintext allowed_by="loopback address"`} {
		if !strings.Contains(out, want) {
			t.Errorf("the start-up log lacks %s:\n%s", want, out)
		}
	}
}
