package exposure

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
)

// grpcListener is a listener with every flag named, as the daemons describe theirs.
func grpcListener(addr string) Listener {
	return Listener{Name: "gRPC", ListenFlag: "--grpc-listen", Addr: addr,
		CertFlag: "--tls-cert", ClientCAFlag: "--tls-client-ca", InsecureFlag: "--insecure-grpc", NoClientAuthFlag: "--tls-no-client-auth",
		Exposes: "write pins"}
}

func TestCheck(t *testing.T) {
	type mod func(*Listener)
	plain := func(*Listener) {}
	tlsOnly := func(l *Listener) { l.Cert = true }
	mtls := func(l *Listener) { l.Cert, l.ClientCA = true, true }
	insecure := func(l *Listener) { l.Insecure = true }
	noAuth := func(l *Listener) { l.Cert, l.NoClientAuth = true, true }
	for _, c := range []struct {
		addr      string
		m         mod
		mode      Mode
		allowedBy string // "" refused
		refusal   string // a flag the refusal names
		weakened  bool
	}{
		{"127.0.0.1:7080", plain, Plaintext, AllowedLoopback, "", false},
		{"[::1]:7080", plain, Plaintext, AllowedLoopback, "", false},
		{"localhost:7080", tlsOnly, TLS, AllowedLoopback, "", false},
		{"unix:///run/pm.sock", plain, Plaintext, AllowedUnix, "", false},
		{"127.0.0.1:7080", mtls, MTLS, "--tls-client-ca", "", false},
		{"10.0.0.1:9000", plain, "", "", "--insecure-grpc", false},
		{":9000", plain, "", "", "--insecure-grpc", false},
		{"0.0.0.0:9000", plain, "", "", "--insecure-grpc", false},
		{"[::]:9000", plain, "", "", "--insecure-grpc", false},
		{"router.example:9000", plain, "", "", "--insecure-grpc", false}, // a name may resolve anywhere
		{"10.0.0.1:9000", insecure, Plaintext, "--insecure-grpc", "", true},
		{"10.0.0.1:9000", tlsOnly, "", "", "--tls-no-client-auth", false},
		{"10.0.0.1:9000", func(l *Listener) { tlsOnly(l); insecure(l) }, "", "", "--tls-client-ca", false}, // --insecure-* only speaks of plaintext
		{"10.0.0.1:9000", noAuth, TLS, "--tls-no-client-auth", "", true},
		{"10.0.0.1:9000", mtls, MTLS, "--tls-client-ca", "", false},
		{"10.0.0.1:9000", func(l *Listener) { mtls(l); l.NoClientAuth = true }, MTLS, "--tls-client-ca", "", false},
	} {
		l := grpcListener(c.addr)
		c.m(&l)
		d, err := l.Check()
		if c.allowedBy == "" {
			if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), c.refusal) || !strings.Contains(err.Error(), "write pins") {
				t.Errorf("%s %+v: %v, want refused naming %s and what it exposes", c.addr, l, err, c.refusal)
			}
			continue
		}
		if err != nil || d.Mode != c.mode || d.AllowedBy != c.allowedBy || d.Weakened != c.weakened {
			t.Errorf("%s %+v: %+v %v, want %s allowed by %s (weakened %v)", c.addr, l, d, err, c.mode, c.allowedBy, c.weakened)
		}
	}
	// A listener that offers no TLS (the node agent's HTTP) names only its insecure flag.
	_, err := Listener{Name: "HTTP", ListenFlag: "--http-listen", Addr: ":8080", InsecureFlag: "--insecure-http"}.Check()
	if err == nil || !strings.Contains(err.Error(), "--insecure-http") || strings.Contains(err.Error(), "--tls") {
		t.Errorf("HTTP without TLS flags: %v", err)
	}
}

func TestCheckAllAndLog(t *testing.T) {
	ok := grpcListener("127.0.0.1:0")
	bad := grpcListener(":7080")
	if _, err := CheckAll([]Listener{ok, bad}); !errors.Is(err, ErrRefused) {
		t.Fatalf("CheckAll with one refused listener: %v", err)
	}
	weak := grpcListener(":7080")
	weak.Insecure = true
	ds, err := CheckAll([]Listener{ok, weak})
	if err != nil || len(ds) != 2 {
		t.Fatalf("CheckAll: %v %v", ds, err)
	}
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, nil))
	Log(logger, ds[0], "127.0.0.1:7080")
	Log(logger, ds[1], "")
	Log(logger, Gossip("10.0.0.1:7946", true), "")
	Log(logger, Gossip("10.0.0.1:7946", false), "")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	want := []string{
		`level=INFO msg="listener open" listener=gRPC flag=--grpc-listen addr=127.0.0.1:7080 protection=plaintext allowed_by="loopback address"`,
		`level=WARN msg="listener open with weakened protection" listener=gRPC flag=--grpc-listen addr=:7080 protection=plaintext allowed_by=--insecure-grpc`,
		`level=INFO msg="listener open" listener=gossip flag=--gossip-listen addr=10.0.0.1:7946 protection=keyring allowed_by=--gossip-key-file`,
		`level=WARN msg="listener open with weakened protection" listener=gossip flag=--gossip-listen addr=10.0.0.1:7946 protection=plaintext allowed_by=--insecure-gossip`,
	}
	if len(lines) != len(want) {
		t.Fatalf("log:\n%s", buf.String())
	}
	for i, w := range want {
		if !strings.HasSuffix(lines[i], w) {
			t.Errorf("line %d: %s\nwant suffix %s", i, lines[i], w)
		}
	}
}
