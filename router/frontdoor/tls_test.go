package frontdoor

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prefixmesh/prefixmesh/router/requests"
)

// The front door serves HTTPS with Config.TLS and presents a client certificate to engines with
// the request service's requests.Config.UpstreamTLS (mTLS toward the nodes).
func TestTLSBothWays(t *testing.T) {
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
			http.Error(w, "client certificate required", http.StatusForbidden)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, okCompletion)
	}))
	up.TLS = &tls.Config{ClientAuth: tls.RequireAnyClientCert}
	up.StartTLS()
	t.Cleanup(up.Close)
	trust := up.Client().Transport.(*http.Transport).TLSClientConfig // trusts the test certificate
	upstreamTLS := trust.Clone()
	upstreamTLS.Certificates = up.TLS.Certificates // the router's client certificate

	f := startFrontDoor(t, []requests.NodeTarget{target("n", up.URL)}, fleetOpts{
		svc: func(c *requests.Config) { c.UpstreamTLS = upstreamTLS },
		cfg: func(c *Config) { c.TLS = &tls.Config{Certificates: up.TLS.Certificates} },
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.fd.Start(t.Context(), ln)
	t.Cleanup(func() { _ = f.fd.Shutdown(context.Background()) })
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: trust}}
	r, err := do(t.Context(), client, "https://"+ln.Addr().String(), "/v1/completions", `{"prompt":"x"}`, nil)
	if err != nil || r.status != 200 || r.text != "ok" {
		t.Fatalf("over TLS: %+v %v", r, err)
	}
}
