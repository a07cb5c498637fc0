package agentd

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// testCA is a throwaway certificate authority that issues leaf certificates into a directory.
type testCA struct {
	dir  string
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newTestCA(t *testing.T, dir, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, filepath.Join(dir, name+".pem"), "CERTIFICATE", der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{dir: dir, cert: cert, key: key, pool: pool}
}

// issue writes name.pem and name-key.pem, a leaf for 127.0.0.1 usable by servers and clients.
func (ca *testCA) issue(t *testing.T, name string, serial int64) (certFile, keyFile string) {
	t.Helper()
	return ca.issueFor(t, name, serial, nil, []net.IP{net.IPv4(127, 0, 0, 1)})
}

// issueFor is issue with the given subject alternative names.
func (ca *testCA) issueFor(t *testing.T, name string, serial int64, dns []string, ips []net.IP) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: ips, DNSNames: dns,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(ca.dir, name+".pem"), filepath.Join(ca.dir, name+"-key.pem")
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "EC PRIVATE KEY", kder)
	return certFile, keyFile
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestMutualTLS runs the agent with --tls-cert/--tls-key/--tls-client-ca: a client with a
// certificate from the client CA gets through, one without a certificate or with a certificate
// from another CA does not.
func TestMutualTLS(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	dir := t.TempDir()
	ca := newTestCA(t, dir, "ca")
	serverCert, serverKey := ca.issue(t, "server", 2)
	clientCert, clientKey := ca.issue(t, "client", 3)
	rogue := newTestCA(t, dir, "rogue-ca")
	rogueCert, rogueKey := rogue.issue(t, "rogue", 4)

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
		creds := credentials.NewTLS(&tls.Config{RootCAs: ca.pool, Certificates: certs, MinVersion: tls.VersionTLS12})
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
	ca := newTestCA(t, dir, "ca")
	serverCert, serverKey := ca.issueFor(t, "router", 2, []string{"prefixmesh.cluster"}, nil)
	clientCert, clientKey := ca.issue(t, "node", 3)
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
