package router

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	procv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/prefixmesh/prefixmesh/internal/tokenizer"
	"github.com/prefixmesh/prefixmesh/internal/tracing"
	"github.com/prefixmesh/prefixmesh/internal/tracing/spans"
	"github.com/prefixmesh/prefixmesh/internal/tracing/tracingtest"
	"github.com/prefixmesh/prefixmesh/local"
	"github.com/prefixmesh/prefixmesh/node/simengine"
	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
	"github.com/prefixmesh/prefixmesh/router/extproc"
	"github.com/prefixmesh/prefixmesh/router/extproc/fakegw"
	"github.com/prefixmesh/prefixmesh/router/frontdoor"
	"github.com/prefixmesh/prefixmesh/router/requests"
	"github.com/prefixmesh/prefixmesh/routing"
)

// traceWait bounds every wait of the tracing test: the spans' export (every 10 ms) and requests.
const traceWait = 20 * time.Second

// recordingEngine is a simulated engine that records the trace context of every generation
// request it receives, and answers 503 while failNext (shared by the fleet) is positive.
type recordingEngine struct {
	id       string
	h        http.Handler
	failNext *atomic.Int32

	mu          sync.Mutex
	traceparent []string
}

func (e *recordingEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/v1/") && r.Method == http.MethodPost {
		e.mu.Lock()
		e.traceparent = append(e.traceparent, r.Header.Get("Traceparent"))
		e.mu.Unlock()
		if e.failNext.Add(-1) >= 0 {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, `{"error":{"message":"busy","type":"server_error","code":503}}`)
			return
		}
	}
	e.h.ServeHTTP(w, r)
}

// received returns the traceparents of trace id the engine received.
func (e *recordingEngine) received(traceID string) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, tp := range e.traceparent {
		if strings.Split(tp, "-")[1:2][0] == traceID {
			out = append(out, tp)
		}
	}
	return out
}

// tracedFleet is the router's three doors on one decision path over simulated engines, traced to
// an in-process OTLP receiver through internal/tracing and the environment.
type tracedFleet struct {
	rcv     *tracingtest.Receiver
	engines []*recordingEngine
	byURL   map[string]string // engine endpoint (host:port) → node id
	front   string            // the front door's URL
	route   pb.RouterClient
	gateway string // the fake gateway's URL
	tokens  []uint32
}

const tracePrompt = "The quick brown fox jumps over the lazy dog while the router traces every step it takes. "

func newTracedFleet(t *testing.T) *tracedFleet {
	f := &tracedFleet{rcv: tracingtest.Start(t), byURL: map[string]string{}}
	f.rcv.Setenv(t)
	tp, shutdown, err := tracing.New(context.Background(), tracing.Config{ServiceName: "prefixmesh-router"})
	if err != nil {
		t.Fatal(err)
	}
	if !spans.Enabled(tp) {
		t.Fatal("tracing is off with an OTLP endpoint in the environment")
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), traceWait)
		defer cancel()
		_ = shutdown(ctx)
	})
	tok, err := tokenizer.New(tokenizer.CL100kBase)
	if err != nil {
		t.Fatal(err)
	}
	if f.tokens, err = tokenizer.EncodePrompt(context.Background(), tok, strings.Repeat(tracePrompt, 4)); err != nil {
		t.Fatal(err)
	}
	idx := routing.NewIndex(routing.DefaultIndexConfig())
	var mirror fakeMirror
	failNext := new(atomic.Int32)
	for i := range 3 {
		id := fmt.Sprintf("node-%d", i)
		cfg := simengine.DefaultConfig()
		cfg.KVBlocks, cfg.PrefillTokensPerSec, cfg.DecodeTokensPerSec = 4096, 1e9, 1e9
		eng, err := simengine.New(cfg, local.NewRadixTree(local.Options{}), nil, prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		eng.Start(t.Context())
		re := &recordingEngine{id: id, h: eng.Handler(), failNext: failNext}
		srv := httptest.NewServer(re)
		t.Cleanup(func() { srv.Close(); eng.Close() })
		f.engines = append(f.engines, re)
		f.byURL[strings.TrimPrefix(srv.URL, "http://")] = id
		n := node(id, 16, true, 0)
		n.Meta.EngineURL, n.Meta.Model = srv.URL, cfg.Model
		mirror = append(mirror, n)
		var hashes []uint64
		if i == 1 { // node-1 holds the prompt: a decision with a prefix to estimate
			hashes = local.BlockHashes(f.tokens, 16, 0)
		}
		idx.ReplaceNode(id, 1, 1, hashes)
	}
	pol, err := routing.NewPolicy(routing.PolicyPrefixMesh, routing.DefaultPolicyConfig())
	if err != nil {
		t.Fatal(err)
	}
	d, err := routing.NewDecider(idx, routing.NewOverlay(0, 0), pol, routing.DeciderConfig{})
	if err != nil {
		t.Fatal(err)
	}
	nodes := requests.MirrorNodes{M: mirror}

	// The request service, and the HTTP front door over it.
	pk, err := requests.NewDeciderPicker(nodes, d, requests.PolicyPickerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	scfg := requests.DefaultConfig()
	scfg.TracerProvider = tp
	svc, err := requests.New(scfg, requests.Deps{Picker: pk, Nodes: nodes})
	if err != nil {
		t.Fatal(err)
	}
	fcfg := frontdoor.DefaultConfig()
	fcfg.TracerProvider = tp
	fd, err := frontdoor.New(fcfg, frontdoor.Deps{Service: svc})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(fd.Handler())
	t.Cleanup(front.Close)
	f.front = front.URL

	// gRPC Route.
	rcfg := DefaultConfig()
	rcfg.Decider, rcfg.Tokenizer, rcfg.TracerProvider = d, tok, tp
	rs, err := NewServer(NewView(mirror, idx), rcfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	f.route = startServer(t, rs)

	// The ext_proc endpoint picker over the same service, behind the fake gateway.
	ecfg := extproc.DefaultConfig()
	ecfg.TracerProvider = tp
	epp, err := extproc.New(ecfg, extproc.Deps{Picker: svc, Nodes: nodes})
	if err != nil {
		t.Fatal(err)
	}
	epp.SetReady(true)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(epp.GRPCOptions()...)
	epp.Register(g)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	gw := httptest.NewServer(fakegw.New(extprocv3.NewExternalProcessorClient(cc), fakegw.Config{
		RequestMode: procv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseMode: procv3.ProcessingMode_FULL_DUPLEX_STREAMED}))
	t.Cleanup(gw.Close)
	f.gateway = gw.URL
	return f
}

// clientTrace is a traceparent a client would send: its trace id and span id.
type clientTrace struct{ traceID, spanID string }

func newClientTrace(n int) clientTrace {
	return clientTrace{traceID: fmt.Sprintf("%032x", 0xabc000+n), spanID: fmt.Sprintf("%016x", 0xdef000+n)}
}

func (c clientTrace) header() string { return "00-" + c.traceID + "-" + c.spanID + "-01" }

// post sends a completion with the client's traceparent and returns the response's headers and
// body, read to the end.
func (f *tracedFleet) post(t *testing.T, base string, ct clientTrace, body map[string]any) (http.Header, string) {
	t.Helper()
	b, _ := json.Marshal(body)
	ctx, cancel := context.WithTimeout(context.Background(), traceWait)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions", bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Traceparent", ct.header())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d, %v: %s", resp.StatusCode, err, raw)
	}
	return resp.Header, string(raw)
}

// engineParents returns the parent span ids in the traceparents the engines received for trace
// id, and which engine got each.
func (f *tracedFleet) engineParents(t *testing.T, traceID string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, e := range f.engines {
		for _, tp := range e.received(traceID) {
			parts := strings.Split(tp, "-")
			if len(parts) != 4 || parts[0] != "00" || parts[1] != traceID {
				t.Fatalf("engine %s received traceparent %q", e.id, tp)
			}
			out[parts[2]] = e.id
		}
	}
	return out
}

// one returns the only span called name among spans, failing otherwise.
func one(t *testing.T, sp []tracingtest.Span, name string) tracingtest.Span {
	t.Helper()
	s := tracingtest.Named(sp, name)
	if len(s) != 1 {
		t.Fatalf("%d spans %q, want 1:\n%s", len(s), name, tracingtest.Dump(sp))
	}
	return s[0]
}

// names lists spans' names, sorted as received.
func names(sp []tracingtest.Span) []string {
	var out []string
	for _, s := range sp {
		out = append(out, s.Name)
	}
	return out
}

// hasSpans is a Wait condition: trace id holds a span called root, ended with all of want's
// names among the spans of its trace.
func hasSpans(traceID, root string, want ...string) func([]tracingtest.Span) error {
	return func(all []tracingtest.Span) error {
		sp := tracingtest.InTrace(all, traceID)
		if len(tracingtest.Named(sp, root)) == 0 {
			return fmt.Errorf("no %q in trace %s", root, traceID)
		}
		for _, w := range want {
			if len(tracingtest.Named(sp, w)) == 0 {
				return fmt.Errorf("no %q in trace %s", w, traceID)
			}
		}
		return nil
	}
}

// checkDecide checks a decide span's attributes against what the door answered.
func checkDecide(t *testing.T, d tracingtest.Span, node string, estimated, prompt int) {
	t.Helper()
	if d.Attrs["prefixmesh.node"] != node {
		t.Errorf("decide: node %v, want %s (the one that served)", d.Attrs["prefixmesh.node"], node)
	}
	if d.Attrs["prefixmesh.estimated_matched_tokens"] != int64(estimated) {
		t.Errorf("decide: estimated_matched_tokens %v, want %d", d.Attrs["prefixmesh.estimated_matched_tokens"], estimated)
	}
	if d.Attrs["prefixmesh.prompt_tokens"] != int64(prompt) {
		t.Errorf("decide: prompt_tokens %v, want %d", d.Attrs["prefixmesh.prompt_tokens"], prompt)
	}
	if d.Attrs["prefixmesh.policy"] != routing.PolicyPrefixMesh || d.Attrs["prefixmesh.reason"] == "" {
		t.Errorf("decide: policy %v, reason %v", d.Attrs["prefixmesh.policy"], d.Attrs["prefixmesh.reason"])
	}
	if ttft, ok := d.Attrs["prefixmesh.predicted_ttft_s"].(float64); !ok || ttft <= 0 {
		t.Errorf("decide: predicted_ttft_s %v, want a positive number of seconds", d.Attrs["prefixmesh.predicted_ttft_s"])
	}
}

// noPrompt checks that no span attribute or status quotes the prompt.
func noPrompt(t *testing.T, sp []tracingtest.Span) {
	t.Helper()
	needle := strings.TrimSpace(tracePrompt)[:20]
	for _, s := range sp {
		if strings.Contains(s.StatusMessage, needle) {
			t.Errorf("span %s's status quotes the prompt: %q", s.Name, s.StatusMessage)
		}
		for k, v := range s.Attrs {
			if str, ok := v.(string); ok && strings.Contains(str, needle) {
				t.Errorf("span %s's attribute %s quotes the prompt: %q", s.Name, k, str)
			}
		}
	}
}

// TestTracingThroughEveryDoor sends one request through each door with a client traceparent and
// checks, as an OTLP collector receives them, the span tree, the decision's attributes against
// what the door answered, the trace id carried from the client, and the traceparent that reached
// the engine: the upstream attempt's (front door) or the picker's (ext_proc, by header mutation).
func TestTracingThroughEveryDoor(t *testing.T) {
	f := newTracedFleet(t)
	prompt := strings.Repeat(tracePrompt, 4)

	t.Run("front door", func(t *testing.T) {
		ct := newClientTrace(1)
		h, body := f.post(t, f.front, ct, map[string]any{"model": "prefixmesh-sim", "prompt": prompt, "max_tokens": 3,
			"stream": true})
		if !strings.Contains(body, "data: [DONE]") {
			t.Fatalf("stream did not end: %q", body)
		}
		all := f.rcv.Wait(t, traceWait, "front door spans", hasSpans(ct.traceID, "POST /v1/completions",
			spans.SpanAdmission, spans.SpanTokenize, spans.SpanDecide, spans.SpanUpstream, spans.SpanFirstByte))
		sp := tracingtest.InTrace(all, ct.traceID)
		srv := one(t, sp, "POST /v1/completions")
		if srv.ParentSpanID != ct.spanID || srv.Kind != tracepb.Span_SPAN_KIND_SERVER || srv.Attrs["http.response.status_code"] != int64(200) {
			t.Fatalf("server span: parent %s (client's %s), kind %v, attrs %v", srv.ParentSpanID, ct.spanID, srv.Kind, srv.Attrs)
		}
		got := names(tracingtest.Children(sp, srv))
		slices.Sort(got)
		if strings.Join(got, ",") != "admission,decide,tokenize,upstream" {
			t.Fatalf("the server span's children: %v", got)
		}
		for _, name := range []string{spans.SpanAdmission, spans.SpanTokenize, spans.SpanDecide, spans.SpanUpstream} {
			if s := one(t, sp, name); s.ParentSpanID != srv.SpanID {
				t.Fatalf("%s is not a child of the server span:\n%s", name, tracingtest.Dump(sp))
			}
		}
		estimated, _ := strconv.Atoi(h.Get(frontdoor.HeaderEstimate))
		if estimated == 0 {
			t.Fatalf("the front door estimated nothing for a prompt node-1 holds (%s)", h.Get(frontdoor.HeaderNode))
		}
		checkDecide(t, one(t, sp, spans.SpanDecide), h.Get(frontdoor.HeaderNode), estimated, len(f.tokens))
		if tk := one(t, sp, spans.SpanTokenize); tk.Attrs["prefixmesh.prompt_tokens"] != int64(len(f.tokens)) {
			t.Errorf("tokenize: %v", tk.Attrs)
		}
		up := one(t, sp, spans.SpanUpstream)
		if up.Kind != tracepb.Span_SPAN_KIND_CLIENT || up.Attrs["prefixmesh.node"] != h.Get(frontdoor.HeaderNode) ||
			up.Attrs["prefixmesh.attempt"] != int64(1) || up.Attrs["http.response.status_code"] != int64(200) ||
			up.Attrs["server.address"] != "127.0.0.1" || up.StatusCode == tracepb.Status_STATUS_CODE_ERROR {
			t.Fatalf("upstream span: kind %v, status %v, attrs %v", up.Kind, up.StatusCode, up.Attrs)
		}
		fb := one(t, sp, spans.SpanFirstByte)
		if fb.ParentSpanID != up.SpanID || fb.End.After(up.End) {
			t.Fatalf("first_byte is not within the upstream attempt:\n%s", tracingtest.Dump(sp))
		}
		// The engine got the attempt's traceparent, in the client's trace, not the client's own.
		if got := f.engineParents(t, ct.traceID); len(got) != 1 || got[up.SpanID] != h.Get(frontdoor.HeaderNode) {
			t.Fatalf("engines received parents %v; want the upstream span %s on %s", got, up.SpanID, h.Get(frontdoor.HeaderNode))
		}
		noPrompt(t, sp)
	})

	t.Run("front door retry", func(t *testing.T) {
		ct := newClientTrace(2)
		f.engines[0].failNext.Store(1) // the first attempt, wherever it goes, answers 503
		h, _ := f.post(t, f.front, ct, map[string]any{"model": "prefixmesh-sim", "prompt": prompt, "max_tokens": 2})
		all := f.rcv.Wait(t, traceWait, "retry spans", func(all []tracingtest.Span) error {
			sp := tracingtest.InTrace(all, ct.traceID)
			if len(tracingtest.Named(sp, "POST /v1/completions")) == 0 || len(tracingtest.Named(sp, spans.SpanUpstream)) < 2 {
				return fmt.Errorf("have %v", names(sp))
			}
			return nil
		})
		sp := tracingtest.InTrace(all, ct.traceID)
		srv := one(t, sp, "POST /v1/completions")
		var ups, decides []tracingtest.Span
		for _, c := range tracingtest.Children(sp, srv) {
			switch c.Name {
			case spans.SpanUpstream:
				ups = append(ups, c)
			case spans.SpanDecide:
				decides = append(decides, c)
			}
		}
		if len(ups) != 2 || len(decides) != 2 {
			t.Fatalf("want two sibling attempts, each decided:\n%s", tracingtest.Dump(sp))
		}
		if ups[0].Attrs["prefixmesh.attempt"] == int64(2) {
			ups[0], ups[1] = ups[1], ups[0]
		}
		first, second := ups[0], ups[1]
		if first.Attrs["prefixmesh.attempt"] != int64(1) || second.Attrs["prefixmesh.attempt"] != int64(2) {
			t.Fatalf("attempt numbers:\n%s", tracingtest.Dump(ups))
		}
		if first.StatusCode != tracepb.Status_STATUS_CODE_ERROR || first.Attrs["http.response.status_code"] != int64(503) ||
			second.StatusCode == tracepb.Status_STATUS_CODE_ERROR || second.Attrs["http.response.status_code"] != int64(200) {
			t.Fatalf("attempts:\n%s", tracingtest.Dump([]tracingtest.Span{first, second}))
		}
		if second.Attrs["prefixmesh.node"] != h.Get(frontdoor.HeaderNode) || first.Attrs["prefixmesh.node"] == second.Attrs["prefixmesh.node"] {
			t.Fatalf("attempt nodes %v then %v; served by %s", first.Attrs["prefixmesh.node"], second.Attrs["prefixmesh.node"], h.Get(frontdoor.HeaderNode))
		}
		got := f.engineParents(t, ct.traceID)
		if len(got) != 2 || got[first.SpanID] != first.Attrs["prefixmesh.node"] || got[second.SpanID] != second.Attrs["prefixmesh.node"] {
			t.Fatalf("engines received parents %v; want attempt 1 %s and attempt 2 %s", got, first.SpanID, second.SpanID)
		}
	})

	t.Run("grpc route", func(t *testing.T) {
		ct := newClientTrace(3)
		ctx, cancel := context.WithTimeout(context.Background(), traceWait)
		defer cancel()
		ctx = metadata.AppendToOutgoingContext(ctx, "traceparent", ct.header())
		resp, err := f.route.Route(ctx, &pb.RouteRequest{Text: prompt, Model: "prefixmesh-sim"})
		if err != nil {
			t.Fatal(err)
		}
		all := f.rcv.Wait(t, traceWait, "Route spans", hasSpans(ct.traceID, routeSpanName, spans.SpanTokenize, spans.SpanDecide))
		sp := tracingtest.InTrace(all, ct.traceID)
		srv := one(t, sp, routeSpanName)
		if srv.ParentSpanID != ct.spanID || srv.Kind != tracepb.Span_SPAN_KIND_SERVER || srv.Attrs["rpc.grpc.status_code"] != int64(0) {
			t.Fatalf("Route span: parent %s (client's %s), kind %v, attrs %v", srv.ParentSpanID, ct.spanID, srv.Kind, srv.Attrs)
		}
		for _, name := range []string{spans.SpanTokenize, spans.SpanDecide} {
			if s := one(t, sp, name); s.ParentSpanID != srv.SpanID {
				t.Fatalf("%s is not a child of the Route span:\n%s", name, tracingtest.Dump(sp))
			}
		}
		checkDecide(t, one(t, sp, spans.SpanDecide), resp.GetNodeId(), int(resp.GetEstimatedMatchedTokens()), int(resp.GetPromptTokens()))
		noPrompt(t, sp)
	})

	t.Run("ext_proc", func(t *testing.T) {
		ct := newClientTrace(4)
		h, body := f.post(t, f.gateway, ct, map[string]any{"model": "prefixmesh-sim", "prompt": prompt, "max_tokens": 2})
		served := f.byURL[h.Get(fakegw.HeaderServed)]
		if served == "" {
			t.Fatalf("served by %q; body %q", h.Get(fakegw.HeaderServed), body)
		}
		const root = "ext_proc POST /v1/completions"
		all := f.rcv.Wait(t, traceWait, "ext_proc spans", hasSpans(ct.traceID, root, spans.SpanDecide))
		sp := tracingtest.InTrace(all, ct.traceID)
		ep := one(t, sp, root)
		if ep.ParentSpanID != ct.spanID || ep.Attrs["prefixmesh.served_node"] != served || ep.Attrs["http.response.status_code"] != int64(200) {
			t.Fatalf("picker span: parent %s (client's %s), attrs %v", ep.ParentSpanID, ct.spanID, ep.Attrs)
		}
		dec := one(t, sp, spans.SpanDecide)
		if dec.ParentSpanID != ep.SpanID {
			t.Fatalf("decide is not a child of the picker's span:\n%s", tracingtest.Dump(sp))
		}
		est := -1
		if v, ok := dec.Attrs["prefixmesh.estimated_matched_tokens"].(int64); ok {
			est = int(v)
		}
		if est <= 0 {
			t.Errorf("decide: estimated_matched_tokens %v for a prompt node-1 holds", dec.Attrs["prefixmesh.estimated_matched_tokens"])
		}
		checkDecide(t, dec, served, est, len(f.tokens))
		// The header mutation set traceparent to the picker's span: the gateway forwarded it.
		if got := f.engineParents(t, ct.traceID); len(got) != 1 || got[ep.SpanID] != served {
			t.Fatalf("engines received parents %v; want the picker's span %s on %s", got, ep.SpanID, served)
		}
		noPrompt(t, sp)
	})
}

// Without a traceparent the front door starts a trace of its own and still sends the engine the
// attempt's traceparent.
func TestTracingNewTrace(t *testing.T) {
	f := newTracedFleet(t)
	b, _ := json.Marshal(map[string]any{"model": "prefixmesh-sim", "prompt": f.tokens, "max_tokens": 2})
	resp, err := http.Post(f.front+"/v1/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	all := f.rcv.Wait(t, traceWait, "spans", func(all []tracingtest.Span) error {
		if len(tracingtest.Named(all, "POST /v1/completions")) == 0 {
			return fmt.Errorf("no server span")
		}
		return nil
	})
	srv := one(t, all, "POST /v1/completions")
	if srv.ParentSpanID != "" {
		t.Fatalf("server span has parent %s without a traceparent", srv.ParentSpanID)
	}
	sp := tracingtest.InTrace(all, srv.TraceID)
	if len(tracingtest.Named(sp, spans.SpanTokenize)) != 0 {
		t.Fatalf("a prompt of token ids was tokenised:\n%s", tracingtest.Dump(sp))
	}
	up := one(t, sp, spans.SpanUpstream)
	if got := f.engineParents(t, srv.TraceID); len(got) != 1 || got[up.SpanID] == "" {
		t.Fatalf("engines received parents %v; want the upstream span %s", got, up.SpanID)
	}
}
