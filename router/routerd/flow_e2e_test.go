package routerd

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
)

// TestFlowControlEndToEnd: `serve --flow-control` wires flow control into the front door and
// Route over the router's own view of real (simulated) nodes. A staleness threshold of 1 ns makes
// every load report stale, so the fleet is saturated by the fail-closed rule whatever the nodes
// do: a sheddable request (its class never waits) is shed at once, a standard one after its
// 100 ms wait, through both doors with their answers; a dry run is never queued; the series
// exist from the start and count the sheds.
func TestFlowControlEndToEnd(t *testing.T) {
	h := newHarness(t)
	r, _ := h.router("router-0", "--flow-control", "--flow-stale-after=1ns",
		"--flow-class-queued=sheddable=0", "--flow-max-wait=standard=100ms")
	for i := range 2 {
		h.node(nodeSpec{id: fmt.Sprintf("node-%d", i), kvBlocks: 1024}, r["gossip"], r["grpc"])
	}
	cc := dialT(t, r["grpc"])
	route := pb.NewRouterClient(cc)
	h.eventually("the router sees both nodes (a dry run, never queued)", func() error {
		resp, err := route.Route(context.Background(), &pb.RouteRequest{Tokens: []uint32{1, 2, 3}, DryRun: true})
		if err != nil {
			return err
		}
		if len(resp.GetCandidates()) != 2 {
			return fmt.Errorf("%d candidates", len(resp.GetCandidates()))
		}
		return nil
	})

	post := func(class string) (int, http.Header, string) {
		body := `{"model":"prefixmesh-sim","prompt":"hello","max_tokens":2}`
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+r["http"]+"/v1/completions", bytes.NewReader([]byte(body)))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Prefixmesh-Priority", class)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, string(b)
	}
	for class, reason := range map[string]string{"sheddable": "queue-full", "standard": "wait-timeout"} {
		code, hdr, body := post(class)
		if code != http.StatusTooManyRequests || hdr.Get("X-Prefixmesh-Dropped-Reason") != reason || hdr.Get("Retry-After") == "" {
			t.Fatalf("front door, %s: %d %v %s; want 429 %s with Retry-After", class, code, hdr, body, reason)
		}
		var trailer metadata.MD
		ctx := metadata.AppendToOutgoingContext(t.Context(), "x-prefixmesh-priority", class)
		_, err := route.Route(ctx, &pb.RouteRequest{Tokens: []uint32{1, 2, 3}}, grpc.Trailer(&trailer))
		if status.Code(err) != codes.ResourceExhausted || fmt.Sprint(trailer.Get("x-prefixmesh-dropped-reason")) != "["+reason+"]" {
			t.Fatalf("Route, %s: %v, trailer %v; want ResourceExhausted %s", class, err, trailer, reason)
		}
	}

	resp, err := http.Get("http://" + r["http"] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`prefixmesh_flow_shed_total{class="sheddable",reason="queue-full"} 2`,
		`prefixmesh_flow_shed_total{class="standard",reason="wait-timeout"} 2`,
		`prefixmesh_flow_shed_total{class="critical",reason="displaced"} 0`,
		`prefixmesh_flow_queued_requests{class="standard"} 0`,
		`prefixmesh_flow_dispatched_total{class="critical",path="direct"} 0`,
		`prefixmesh_flow_tenant_requests_total{outcome="shed",tenant="none"} 4`,
		`prefixmesh_flow_saturation{model="prefixmesh-sim"} 1`,
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("/metrics has no %s", want)
		}
	}
}
