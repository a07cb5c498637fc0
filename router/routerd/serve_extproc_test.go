package routerd

import (
	"crypto/tls"
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// TestExtProcSelfSigned serves grpc.health.v1 with the endpoint picker's self-signed credentials
// and reaches it as gateways do: TLS without verifying the certificate (kgateway's ext_proc
// cluster has an empty validation context), and no client certificate.
func TestExtProcSelfSigned(t *testing.T) {
	creds, err := extProcCreds(ExtProcConfig{SelfSigned: true})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(creds))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}))) //nolint:gosec // as the gateway does
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	resp, err := healthpb.NewHealthClient(cc).Check(t.Context(), &healthpb.HealthCheckRequest{})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health over self-signed TLS: %v %v", resp, err)
	}
	cert, err := selfSigned(time.Unix(1_800_000_000, 0))
	if err != nil {
		t.Fatal(err)
	}
	if len(cert.Certificate) != 1 {
		t.Fatalf("%d certificates", len(cert.Certificate))
	}
}

// TestExtProcFlags validates the endpoint picker's flags.
func TestExtProcFlags(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "absent.pem")
	for _, c := range []struct {
		e  ExtProcConfig
		ok bool
	}{
		{ExtProcConfig{}, true},
		{ExtProcConfig{Listen: ":9002", Fallbacks: 2, SelfSigned: true}, true},
		{ExtProcConfig{Listen: "9002"}, false},
		{ExtProcConfig{Listen: ":9002", Fallbacks: -1}, false},
		{ExtProcConfig{Listen: ":9002", Fallbacks: maxExtProcFallbacks + 1}, false},
		{ExtProcConfig{Listen: ":9002", TLSCert: missing}, false},
		{ExtProcConfig{Listen: ":9002", TLSCert: missing, TLSKey: missing}, false},
	} {
		err := ServeConfig{ExtProc: c.e}.validateExtProc()
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, errServeConfig)) {
			t.Errorf("%+v: %v, want ok %v", c.e, err, c.ok)
		}
	}
}
