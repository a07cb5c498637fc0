package routerd

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"google.golang.org/grpc/metadata"

	"github.com/prefixmesh/prefixmesh/internal/tracing"
	"github.com/prefixmesh/prefixmesh/internal/tracing/spans"
	"github.com/prefixmesh/prefixmesh/internal/tracing/tracingtest"
	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
)

// TestServeTracesAndFlushesOnDrain runs `serve` with the OTLP environment pointing at an
// in-process receiver and a batch delay longer than the test, so that only the drain's flush can
// deliver the spans: a front-door request and a Route call, each with a client traceparent, are
// in the receiver once the router has stopped, in the client's traces, under the default
// service name.
func TestServeTracesAndFlushesOnDrain(t *testing.T) {
	rcv := tracingtest.Start(t)
	rcv.Setenv(t)
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")
	c := startCluster(t, []nodeSpec{{id: "node-0", kvBlocks: 1024}, {id: "node-1", kvBlocks: 1024}})

	const httpTrace, routeTrace = "0af7651916cd43dd8448eb211c80319c", "4bf92f3577b34da6a3ce929d0e0e4736"
	b, _ := json.Marshal(map[string]any{"model": "prefixmesh-sim", "prompt": prompt(500, 40), "max_tokens": 2})
	ctx, cancel := context.WithTimeout(context.Background(), clusterWait)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+c.router["http"]+"/v1/completions", bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Traceparent", "00-"+httpTrace+"-b7ad6b7169203331-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("front door: %d", resp.StatusCode)
	}
	node := resp.Header.Get("X-Prefixmesh-Node")
	rctx := metadata.AppendToOutgoingContext(ctx, "traceparent", "00-"+routeTrace+"-00f067aa0ba902b7-01")
	r, err := pb.NewRouterClient(c.cc).Route(rctx, &pb.RouteRequest{Tokens: prompt(900, 40), DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(tracingtest.InTrace(rcv.Spans(), httpTrace)); n != 0 {
		t.Fatalf("%d spans arrived before the drain, with a batch delay of 10 minutes", n)
	}

	c.stopRouter() // returns once `serve` has exited: its drain flushed the spans

	sp := rcv.Spans()
	check := func(traceID, root, parent string, want ...string) []tracingtest.Span {
		t.Helper()
		in := tracingtest.InTrace(sp, traceID)
		got := map[string]int{}
		for _, s := range in {
			got[s.Name]++
			if s.Service != "prefixmesh-router" {
				t.Errorf("span %s: service.name %q", s.Name, s.Service)
			}
		}
		if rs := tracingtest.Named(in, root); len(rs) != 1 || rs[0].ParentSpanID != parent {
			t.Fatalf("trace %s: want one %q under %s:\n%s", traceID, root, parent, tracingtest.Dump(in))
		}
		for _, w := range want {
			if got[w] != 1 {
				t.Fatalf("trace %s: %d spans %q, want 1:\n%s", traceID, got[w], w, tracingtest.Dump(in))
			}
		}
		return in
	}
	fd := check(httpTrace, "POST /v1/completions", "b7ad6b7169203331", spans.SpanAdmission, spans.SpanDecide, spans.SpanUpstream, spans.SpanFirstByte)
	if d := tracingtest.Named(fd, spans.SpanDecide)[0]; d.Attrs["prefixmesh.node"] != node {
		t.Fatalf("decide chose %v; %s served", d.Attrs["prefixmesh.node"], node)
	}
	rt := check(routeTrace, pb.Router_ServiceDesc.ServiceName+"/Route", "00f067aa0ba902b7", spans.SpanDecide)
	if d := tracingtest.Named(rt, spans.SpanDecide)[0]; d.Attrs["prefixmesh.node"] != r.GetNodeId() || d.Attrs["prefixmesh.dry_run"] != true {
		t.Fatalf("Route's decide: %v; Route answered %s", d.Attrs, r.GetNodeId())
	}
}

// A bad OpenTelemetry variable is a bad configuration: `serve --validate-only` exits 2 naming it.
func TestServeRejectsBadTracingEnv(t *testing.T) {
	for _, env := range []map[string]string{
		{tracing.EnvEndpoint: "http://127.0.0.1:4317", tracing.EnvProtocol: "http/json"},
		{tracing.EnvTracesExporter: "jaeger"},
		{tracing.EnvSDKDisabled: "maybe"},
	} {
		for _, k := range []string{tracing.EnvSDKDisabled, tracing.EnvTracesExporter, tracing.EnvEndpoint, tracing.EnvTracesEndpoint, tracing.EnvProtocol, tracing.EnvTracesProtocol} {
			t.Setenv(k, env[k])
		}
		var out, errb bytes.Buffer
		code := Main(context.Background(), []string{"--validate-only", "--insecure-gossip"}, &out, &errb)
		var name string
		for k := range env {
			if k != tracing.EnvEndpoint {
				name = k
			}
		}
		if code != 2 || !strings.Contains(errb.String(), name) {
			t.Errorf("%v: exit %d %q; want 2 naming %s", env, code, errb.String(), name)
		}
	}
	t.Setenv(tracing.EnvSDKDisabled, "")
	var out, errb bytes.Buffer
	if code := Main(context.Background(), []string{"--validate-only", "--insecure-gossip"}, &out, &errb); code != 0 {
		t.Errorf("without tracing variables: exit %d %q", code, errb.String())
	}
}
