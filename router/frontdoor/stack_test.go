package frontdoor

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixmesh/prefixmesh/internal/testcerts"
	"github.com/prefixmesh/prefixmesh/internal/tlsfiles"
	"github.com/prefixmesh/prefixmesh/router/requests"
	"github.com/prefixmesh/prefixmesh/routing"
)

// The front door over the request service's Stack, as cmd/router serve builds them, with mTLS on
// both sides from PEM files: clients must show a certificate of the CA to the front door, and
// the service shows its own to the engine.
func TestStackWithMutualTLS(t *testing.T) {
	pki := testcerts.NewCA(t, t.TempDir(), "ca")
	engCert, engKey := pki.IssueFor(t, "engine", nil, []net.IP{net.IPv4(127, 0, 0, 1)})
	routerCert, routerKey := pki.IssueFor(t, "router", nil, []net.IP{net.IPv4(127, 0, 0, 1)})
	clientCert, clientKey := pki.IssueFor(t, "client", nil, []net.IP{net.IPv4(127, 0, 0, 1)})

	engTLS, err := tlsfiles.Server(engCert, engKey, pki.File)
	if err != nil {
		t.Fatal(err)
	}
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(r.TLS.VerifiedChains) == 0 {
			t.Error("engine: unverified client")
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set(requests.HeaderCachedTokens, "0")
		_, _ = io.WriteString(w, okCompletion)
	}))
	up.TLS = engTLS
	up.StartTLS()
	t.Cleanup(up.Close)

	cfg, fcfg := requests.DefaultStackConfig(), DefaultConfig()
	if fcfg.TLS, err = tlsfiles.Server(routerCert, routerKey, pki.File); err != nil {
		t.Fatal(err)
	}
	if cfg.Service.UpstreamTLS, err = tlsfiles.Client(routerCert, routerKey, pki.File); err != nil {
		t.Fatal(err)
	}
	nodes := &nodeList{}
	nodes.set([]requests.NodeTarget{target("n", up.URL)})
	wrapped := false
	cfg.WrapPicker = func(p requests.Picker) requests.Picker { wrapped = true; return p }
	reg := prometheus.NewRegistry()
	st, err := requests.NewStack(cfg, nodes, routing.NewIndex(routing.DefaultIndexConfig()), reg)
	if err != nil {
		t.Fatal(err)
	}
	if !wrapped {
		t.Fatal("WrapPicker not applied")
	}
	fd, err := New(fcfg, Deps{Service: st.Service, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	st.Start(t.Context())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fd.Start(t.Context(), ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := fd.Shutdown(ctx); err != nil {
			t.Error(err)
		}
		st.Close()
	})
	base := "https://" + ln.Addr().String()

	clientTLS, err := tlsfiles.Client(clientCert, clientKey, pki.File)
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: clientTLS}}
	r, err := do(t.Context(), client, base, "/v1/completions", `{"prompt":"over mTLS"}`, nil)
	if err != nil || r.status != 200 || r.text != "ok" {
		t.Fatalf("mTLS request: %+v %v", r, err)
	}
	anon, _ := tlsfiles.Client("", "", pki.File)
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
