package agentd

import (
	"context"
	"crypto/tls"
	"net"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/prefixmesh/prefixmesh/internal/testcerts"
)

// TestMutualTLS runs the agent with --tls-cert/--tls-key/--tls-client-ca: a client with a
// certificate from the client CA gets through, one without a certificate or with a certificate
// from another CA does not.
func TestMutualTLS(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	dir := t.TempDir()
	ca := testcerts.NewCA(t, dir, "ca")
	serverCert, serverKey := ca.IssueFor(t, "server", nil, []net.IP{net.IPv4(127, 0, 0, 1)})
	clientCert, clientKey := ca.IssueFor(t, "client", nil, []net.IP{net.IPv4(127, 0, 0, 1)})
	rogue := testcerts.NewCA(t, dir, "rogue-ca")
	rogueCert, rogueKey := rogue.IssueFor(t, "rogue", nil, []net.IP{net.IPv4(127, 0, 0, 1)})

	cfg := DefaultConfig()
	cfg.GRPCListen, cfg.HTTPListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Engine, cfg.EngineURL = engineExternal, "http://127.0.0.1:9"
	cfg.TLSCert, cfg.TLSKey, cfg.TLSClientCA = serverCert, serverKey, filepath.Join(dir, "ca.pem")
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	logs := newLogWatcher()
	done := make(chan error, 1)
	go func() { done <- Run(runCtx, cfg, logs) }()
	grpcAddr, _ := logs.waitAddrs(t)

	check := func(certs ...tls.Certificate) error {
		creds := credentials.NewTLS(&tls.Config{RootCAs: ca.Pool, Certificates: certs, MinVersion: tls.VersionTLS12})
		conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(creds))
		if err != nil {
			return err
		}
		defer conn.Close()
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err = healthpb.NewHealthClient(conn).Check(cctx, &healthpb.HealthCheckRequest{})
		return err
	}
	load := func(cert, key string) tls.Certificate {
		c, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	if err := check(load(clientCert, clientKey)); err != nil {
		t.Fatalf("client with a certificate from the client CA: %v", err)
	}
	if err := check(); err == nil {
		t.Fatal("client without a certificate got through")
	}
	if err := check(load(rogueCert, rogueKey)); err == nil {
		t.Fatal("client with a certificate from another CA got through")
	}

	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run = %v", err)
		}
	case <-ctx.Done():
		t.Fatal("run did not return after cancel")
	}
}

// TestTLSServerName: with --tls-server-name the agent verifies a router's certificate against
// that name, not the address it dials (routers are dialled by pod IP, which certificates rarely
// name); without it, a certificate that names no IP is refused.
func TestTLSServerName(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	dir := t.TempDir()
	ca := testcerts.NewCA(t, dir, "ca")
	serverCert, serverKey := ca.IssueFor(t, "router", []string{"prefixmesh.cluster"}, nil)
	clientCert, clientKey := ca.IssueFor(t, "node", nil, []net.IP{net.IPv4(127, 0, 0, 1)})
	cert, err := tls.LoadX509KeyPair(serverCert, serverKey)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	dial := func(serverName string) error {
		cfg := DefaultConfig()
		cfg.TLSCert, cfg.TLSKey, cfg.TLSClientCA, cfg.TLSServerName = clientCert, clientKey, filepath.Join(dir, "ca.pem"), serverName
		opt, err := clientCredentials(cfg)
		if err != nil {
			return err
		}
		conn, err := grpc.NewClient(lis.Addr().String(), opt)
		if err != nil {
			return err
		}
		defer conn.Close()
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err = healthpb.NewHealthClient(conn).Check(cctx, &healthpb.HealthCheckRequest{})
		return err
	}
	if err := dial("prefixmesh.cluster"); err != nil {
		t.Fatalf("with --tls-server-name: %v", err)
	}
	if err := dial(""); err == nil {
		t.Fatal("a certificate that names no IP was accepted for an IP address")
	}
}
