package frontdoor

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixmesh/prefixmesh/internal/tlsfiles"
	"github.com/prefixmesh/prefixmesh/routing"
)

// testPKI is a CA and certificates it signed, written as PEM files.
type testPKI struct {
	dir    string
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	caFile string
	serial int64
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(der)
	p := &testPKI{dir: t.TempDir(), ca: ca, caKey: key, serial: 1}
	p.caFile = p.write(t, "ca.pem", "CERTIFICATE", der)
	return p
}

func (p *testPKI) write(t *testing.T, name, typ string, der []byte) string {
	t.Helper()
	file := filepath.Join(p.dir, name)
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// issue writes a certificate for 127.0.0.1 usable by servers and clients; it returns its files.
func (p *testPKI) issue(t *testing.T, name string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p.serial++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(p.serial), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return p.write(t, name+".pem", "CERTIFICATE", der), p.write(t, name+"-key.pem", "EC PRIVATE KEY", kder)
}

// The Stack cmd/router serve builds, with mTLS on both sides from PEM files: clients must show a
// certificate of the CA to the front door, and the front door shows its own to the engine.
func TestStackWithMutualTLS(t *testing.T) {
	pki := newTestPKI(t)
	engCert, engKey := pki.issue(t, "engine")
	routerCert, routerKey := pki.issue(t, "router")
	clientCert, clientKey := pki.issue(t, "client")

	engTLS, err := tlsfiles.Server(engCert, engKey, pki.caFile)
	if err != nil {
		t.Fatal(err)
	}
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(r.TLS.VerifiedChains) == 0 {
			t.Error("engine: unverified client")
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set(HeaderCachedTokens, "0")
		_, _ = io.WriteString(w, okCompletion)
	}))
	up.TLS = engTLS
	up.StartTLS()
	t.Cleanup(up.Close)

	cfg := DefaultStackConfig()
	if cfg.Server.TLS, err = tlsfiles.Server(routerCert, routerKey, pki.caFile); err != nil {
		t.Fatal(err)
	}
	if cfg.Server.UpstreamTLS, err = tlsfiles.Client(routerCert, routerKey, pki.caFile); err != nil {
		t.Fatal(err)
	}
	nodes := &nodeList{}
	nodes.set([]NodeTarget{target("n", up.URL)})
	wrapped := false
	cfg.WrapPicker = func(p Picker) Picker { wrapped = true; return p }
	st, err := NewStack(cfg, nodes, routing.NewIndex(routing.DefaultIndexConfig()), prometheus.NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !wrapped {
		t.Fatal("WrapPicker not applied")
	}
	st.Start(t.Context())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	st.Server.Start(t.Context(), ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := st.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	})
	base := "https://" + ln.Addr().String()

	clientTLS, err := tlsfiles.Client(clientCert, clientKey, pki.caFile)
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: clientTLS}}
	r, err := do(t.Context(), client, base, "/v1/completions", `{"prompt":"over mTLS"}`, nil)
	if err != nil || r.status != 200 || r.text != "ok" {
		t.Fatalf("mTLS request: %+v %v", r, err)
	}
	anon, _ := tlsfiles.Client("", "", pki.caFile)
	if _, err := do(t.Context(), &http.Client{Transport: &http.Transport{TLSClientConfig: anon}}, base, "/v1/completions", `{"prompt":"x"}`, nil); err == nil {
		t.Fatal("a client without a certificate was served")
	}
	if _, err := tlsfiles.Client(clientCert, "", ""); err == nil {
		t.Fatal("certificate without key accepted")
	}
	if _, err := tlsfiles.Server(routerCert, routerKey, routerKey); err == nil {
		t.Fatal("a key file accepted as a CA file")
	}
}
