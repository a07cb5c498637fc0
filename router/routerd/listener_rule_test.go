package routerd

import (
	"bytes"
	"context"
	"crypto/tls"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/prefixmesh/prefixmesh/internal/testcerts"
)

// TestListenerRule checks the one rule on every router listener with non-loopback addresses,
// validating only (nothing listens): plaintext needs the listener's --insecure-* flag, TLS needs
// a client CA or the listener's no-client-auth flag, and loopback needs neither.
func TestListenerRule(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, dir, "ca")
	cert, key := ca.Issue(t, "router")
	tlsFor := func(prefix string) []string {
		return []string{"--" + prefix + "-cert=" + cert, "--" + prefix + "-key=" + key}
	}
	with := func(parts ...[]string) []string {
		var out []string
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	caFlag := func(prefix string) []string { return []string{"--" + prefix + "-client-ca=" + ca.File} }
	for _, c := range []struct {
		name string
		args []string
		want string // "" accepted; else a flag the refusal must name
	}{
		{"everything on loopback", nil, ""},
		{"default listeners", []string{"--grpc-listen=127.0.0.1:7080"}, ""},

		{"gRPC plaintext", []string{"--grpc-listen=10.0.0.1:7080"}, "--insecure-grpc"},
		{"gRPC plaintext, insecure flag", []string{"--grpc-listen=10.0.0.1:7080", "--insecure-grpc"}, ""},
		{"gRPC TLS without client CA", with([]string{"--grpc-listen=10.0.0.1:7080"}, tlsFor("tls")), "--tls-no-client-auth"},
		{"gRPC TLS, no-client-auth flag", with([]string{"--grpc-listen=10.0.0.1:7080", "--tls-no-client-auth"}, tlsFor("tls")), ""},
		{"gRPC mTLS", with([]string{"--grpc-listen=10.0.0.1:7080"}, tlsFor("tls"), caFlag("tls")), ""},
		{"gRPC TLS without client CA on loopback", tlsFor("tls"), ""},

		{"Raft plaintext", []string{"--raft-listen=10.0.0.1:7000"}, "--insecure-raft"},
		{"Raft plaintext, insecure flag", []string{"--raft-listen=10.0.0.1:7000", "--insecure-raft"}, ""},
		{"Raft TLS without client CA", with([]string{"--raft-listen=:7000"}, tlsFor("tls")), "--tls-no-client-auth"},
		{"Raft mTLS", with([]string{"--raft-listen=:7000", "--grpc-listen=:7080"}, tlsFor("tls"), caFlag("tls")), ""},

		{"front door plaintext", []string{"--http-listen=10.0.0.1:8081"}, "--insecure-http"},
		{"front door plaintext on a wildcard", []string{"--http-listen=:8081"}, "--insecure-http"},
		{"front door plaintext, insecure flag", []string{"--http-listen=10.0.0.1:8081", "--insecure-http"}, ""},
		{"front door TLS without client CA", with([]string{"--http-listen=10.0.0.1:8081"}, tlsFor("http-tls")), "--http-tls-no-client-auth"},
		{"front door TLS, no-client-auth flag", with([]string{"--http-listen=10.0.0.1:8081", "--http-tls-no-client-auth"}, tlsFor("http-tls")), ""},
		{"front door mTLS", with([]string{"--http-listen=10.0.0.1:8081"}, tlsFor("http-tls"), caFlag("http-tls")), ""},

		{"metrics plaintext", []string{"--metrics-listen=10.0.0.1:9090"}, "--insecure-metrics"},
		{"metrics plaintext, insecure flag", []string{"--metrics-listen=10.0.0.1:9090", "--insecure-metrics"}, ""},
		{"metrics TLS without client CA", with([]string{"--metrics-listen=10.0.0.1:9090"}, tlsFor("metrics-tls")), "--metrics-tls-no-client-auth"},
		{"metrics mTLS", with([]string{"--metrics-listen=10.0.0.1:9090"}, tlsFor("metrics-tls"), caFlag("metrics-tls")), ""},

		{"picker plaintext", []string{"--ext-proc-listen=10.0.0.1:9000"}, "--insecure-ext-proc"},
		{"picker plaintext, insecure flag", []string{"--ext-proc-listen=10.0.0.1:9000", "--insecure-ext-proc"}, ""},
		{"picker TLS without client CA", with([]string{"--ext-proc-listen=10.0.0.1:9000"}, tlsFor("ext-proc-tls")), "--ext-proc-tls-no-client-auth"},
		{"picker self-signed without client CA", []string{"--ext-proc-listen=10.0.0.1:9000", "--ext-proc-self-signed"}, "--ext-proc-tls-no-client-auth"},
		{"picker self-signed, no-client-auth flag", []string{"--ext-proc-listen=10.0.0.1:9000", "--ext-proc-self-signed", "--ext-proc-tls-no-client-auth"}, ""},
		{"picker self-signed with client CA", with([]string{"--ext-proc-listen=10.0.0.1:9000", "--ext-proc-self-signed"}, caFlag("ext-proc-tls")), ""},
		{"picker mTLS", with([]string{"--ext-proc-listen=10.0.0.1:9000"}, tlsFor("ext-proc-tls"), caFlag("ext-proc-tls")), ""},
		{"picker plaintext on loopback", []string{"--ext-proc-listen=127.0.0.1:9000"}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			// Every other listener on loopback, so that only the one under test decides.
			line := append([]string{"--validate-only", "--insecure-gossip", "--grpc-listen=127.0.0.1:7080",
				"--http-listen=127.0.0.1:8081", "--raft-listen=127.0.0.1:7000"}, c.args...)
			var out, errb bytes.Buffer
			code := Main(context.Background(), line, &out, &errb)
			switch {
			case c.want == "" && code != 0:
				t.Errorf("%v: exit %d %q, want accepted", c.args, code, errb.String())
			case c.want != "" && (code != 2 || !strings.Contains(errb.String(), c.want)):
				t.Errorf("%v: exit %d %q, want refused naming %s", c.args, code, errb.String(), c.want)
			}
		})
	}
}

// syncBuffer is a bytes.Buffer the daemon's goroutines may write while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestEndpointPickerRequiresClientCertificates serves the endpoint picker with
// --ext-proc-tls-cert/--ext-proc-tls-key/--ext-proc-tls-client-ca on 127.0.0.1: a gateway
// without a client certificate cannot open a picker stream, one with a certificate from another
// CA cannot either, and one with a certificate the client CA signed reaches the picker. The
// start-up log names each listener's protection and the flag that allowed it.
func TestEndpointPickerRequiresClientCertificates(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, dir, "ca")
	serverCert, serverKey := ca.Issue(t, "picker")
	gwCert, gwKey := ca.Issue(t, "gateway")
	rogue := testcerts.NewCA(t, dir, "rogue-ca")
	rogueCert, rogueKey := rogue.Issue(t, "rogue")
	addrFile := filepath.Join(dir, "addrs")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	logs := &syncBuffer{}
	go func() {
		done <- Main(ctx, []string{"--grpc-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
			"--gossip-listen", "127.0.0.1:0", "--insecure-gossip", "--node-id", "router-0",
			"--raft-listen", "127.0.0.1:0", "--raft-dir", filepath.Join(dir, "raft"), "--tokenizer", "bytes",
			"--ext-proc-listen", "127.0.0.1:0", "--ext-proc-tls-cert", serverCert, "--ext-proc-tls-key", serverKey,
			"--ext-proc-tls-client-ca", ca.File, "--metrics-listen", "127.0.0.1:0", "--metrics-tls-cert", serverCert,
			"--metrics-tls-key", serverKey, "--metrics-tls-client-ca", ca.File, "--addr-file", addrFile}, logs, logs)
	}()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case <-done:
		case <-time.After(clusterWait):
			t.Errorf("serve did not stop within %v of cancellation", clusterWait)
		}
	}
	defer stop()
	addrs := waitAddrs(t, addrFile)
	addr := addrs["extproc"]
	if addr == "" || addrs["metrics"] == "" {
		t.Fatalf("no extproc or metrics address in the addr file: %v", addrs)
	}
	// --metrics-listen with --metrics-tls-*: Prometheus without a client certificate is refused.
	scrape := func(cfg *tls.Config) (int, error) {
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: clusterWait}
		resp, err := c.Get("https://" + addrs["metrics"] + "/metrics")
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		return resp.StatusCode, nil
	}
	if code, err := scrape(ca.ClientConfig(t, "", "")); err == nil {
		t.Errorf("metrics scraped without a client certificate: %d", code)
	}
	if code, err := scrape(ca.ClientConfig(t, gwCert, gwKey)); err != nil || code != http.StatusOK {
		t.Errorf("metrics with a client certificate: %d %v", code, err)
	}
	dial := func(cfg *credentials.TransportCredentials) *grpc.ClientConn {
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(*cfg))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cc.Close() })
		return cc
	}
	stream := func(cc *grpc.ClientConn) error {
		sctx, scancel := context.WithTimeout(context.Background(), clusterWait)
		defer scancel()
		s, err := extprocv3.NewExternalProcessorClient(cc).Process(sctx)
		if err != nil {
			return err
		}
		if err := s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
			RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{}, EndOfStream: true}}}); err != nil {
			_, rerr := s.Recv() // the handshake's failure arrives on Recv
			return rerr
		}
		_, err = s.Recv()
		return err
	}
	for name, creds := range map[string]credentials.TransportCredentials{
		"no client certificate":    credentials.NewTLS(ca.ClientConfig(t, "", "")),
		"another CA's certificate": credentials.NewTLS(ca.ClientConfig(t, rogueCert, rogueKey)),
	} {
		if err := stream(dial(&creds)); err == nil {
			t.Errorf("%s: the picker stream was served", name)
		}
	}
	good := credentials.NewTLS(ca.ClientConfig(t, gwCert, gwKey))
	hctx, hcancel := context.WithTimeout(context.Background(), clusterWait)
	defer hcancel()
	if _, err := healthpb.NewHealthClient(dial(&good)).Check(hctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("a gateway with a certificate from --ext-proc-tls-client-ca: %v", err)
	}
	stop()
	out := logs.String()
	for _, want := range []string{
		`listener="endpoint picker (ext_proc)"`, `protection=mTLS allowed_by=--ext-proc-tls-client-ca`,
		`listener="gRPC (Router, Pins)"`, `listener="HTTP front door"`, `listener="Raft (pin store)"`,
		`allowed_by="loopback address"`, `listener=metrics flag=--metrics-listen`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the start-up log lacks %s:\n%s", want, out)
		}
	}
}
