package routerd

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	procv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
	"github.com/prefixmesh/prefixmesh/router/extproc"
	"github.com/prefixmesh/prefixmesh/router/extproc/fakegw"
)

// gatewayPost sends a completion through a gateway and returns the served endpoint, the status
// and the engine's cached_tokens (from the JSON body or the stream's usage chunk; -1 if none).
func gatewayPost(t *testing.T, base string, body map[string]any) (served string, cached int, out string) {
	t.Helper()
	b, _ := json.Marshal(body)
	ctx, cancel := context.WithTimeout(context.Background(), clusterWait)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions", bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("through the gateway: %d %s", resp.StatusCode, raw)
	}
	cached = -1
	read := func(p []byte) {
		var u struct {
			Usage *struct {
				Details *struct {
					Cached int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if json.Unmarshal(p, &u) == nil && u.Usage != nil && u.Usage.Details != nil {
			cached = u.Usage.Details.Cached
		}
	}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		sc := bufio.NewScanner(bytes.NewReader(raw))
		for sc.Scan() {
			if p, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				read([]byte(p))
			}
		}
	} else {
		read(raw)
	}
	return resp.Header.Get(fakegw.HeaderServed), cached, string(raw)
}

// metricValue reads one unlabelled series from the router's /metrics.
func metricValue(t *testing.T, httpAddr, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}

// TestEndpointPickerEndToEnd runs `serve --ext-proc-listen` over four simulated node agents and
// drives it through the fake gateway as Envoy would: health says ready once synced; repeated
// prompts land on the node that holds them, whose cached_tokens equals the router's estimate;
// the front door, asked the same prompt, picks the same node (one decision path); streamed
// responses come back whole.
func TestEndpointPickerEndToEnd(t *testing.T) {
	c := startCluster(t, []nodeSpec{
		{id: "node-0", kvBlocks: 1024}, {id: "node-1", kvBlocks: 1024},
		{id: "node-2", kvBlocks: 1024}, {id: "node-3", kvBlocks: 1024},
	}, "--ext-proc-listen=127.0.0.1:0")
	addr := c.router["extproc"]
	if addr == "" {
		t.Fatalf("no extproc address in %v", c.router)
	}
	cc := dialT(t, addr)
	hc := healthpb.NewHealthClient(cc)
	for _, svc := range []string{extproc.ServiceLiveness, extproc.ServiceReadiness, extproc.ServiceExtProc} {
		c.eventually("health "+svc+" SERVING", func() error {
			r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
			if err != nil {
				return err
			}
			if r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				return fmt.Errorf("%v", r.GetStatus())
			}
			return nil
		})
	}
	byEndpoint := map[string]string{}
	for id, a := range c.nodes {
		byEndpoint[a["http"]] = id
	}
	for _, mode := range []procv3.ProcessingMode_BodySendMode{procv3.ProcessingMode_FULL_DUPLEX_STREAMED, procv3.ProcessingMode_BUFFERED} {
		g := fakegw.New(extprocv3.NewExternalProcessorClient(cc), fakegw.Config{RequestMode: mode, ResponseMode: mode, Chunks: []int{5, 1021}})
		srv := httptest.NewServer(g)
		t.Cleanup(srv.Close)
		for i := range 3 {
			long := prompt(20000+int(mode)*1000+i*400, 300) // 18 full blocks
			served, cached, _ := gatewayPost(t, srv.URL, map[string]any{"model": "prefixmesh-sim", "prompt": long, "max_tokens": 2})
			node := byEndpoint[served]
			if node == "" || cached != 0 {
				t.Fatalf("first time: served by %q (%q), cached_tokens %d", served, node, cached)
			}
			c.eventually("the prompt's node reports it in its summary", func() error {
				r, err := pb.NewRouterClient(c.cc).Route(context.Background(), &pb.RouteRequest{Tokens: long, DryRun: true})
				if err != nil {
					return err
				}
				if r.GetNodeId() != node || r.GetEstimatedMatchedTokens() != 288 {
					return fmt.Errorf("route: %s with %d tokens, want %s with 288", r.GetNodeId(), r.GetEstimatedMatchedTokens(), node)
				}
				return nil
			})
			again, cached2, _ := gatewayPost(t, srv.URL, map[string]any{"model": "prefixmesh-sim", "prompt": long, "max_tokens": 2})
			if byEndpoint[again] != node || cached2 != 288 {
				t.Fatalf("repeated prompt: served by %q, first by %q; cached_tokens %d, want 288", byEndpoint[again], node, cached2)
			}
			fd := post(t, c.router["http"], map[string]any{"model": "prefixmesh-sim", "prompt": long, "max_tokens": 2})
			if fd.node != node {
				t.Fatalf("the front door picks %q for the prompt the endpoint picker sent to %q", fd.node, node)
			}
			streamed, cached3, out := gatewayPost(t, srv.URL, map[string]any{"model": "prefixmesh-sim", "prompt": long, "max_tokens": 3,
				"stream": true, "stream_options": map[string]any{"include_usage": true}})
			if byEndpoint[streamed] != node || cached3 != 288 || !strings.HasSuffix(strings.TrimSpace(out), "data: [DONE]") {
				t.Fatalf("streamed repeat: served by %q, cached_tokens %d, body %q", byEndpoint[streamed], cached3, out)
			}
		}
	}
	// The picker ends a request once it has echoed the last chunk, maybe just after the client
	// read it.
	c.eventually("every request compared", func() error {
		if seen := metricValue(t, c.router["http"], "prefixmesh_extproc_estimate_compared_total"); seen != 18 {
			return fmt.Errorf("%v compared", seen)
		}
		return nil
	})
	seen := metricValue(t, c.router["http"], "prefixmesh_extproc_estimate_compared_total")
	exact := metricValue(t, c.router["http"], "prefixmesh_extproc_estimate_exact_total")
	if exact != seen {
		t.Fatalf("estimate == cached_tokens on %v of %v requests through the endpoint picker; want 18 of 18", exact, seen)
	}
}
