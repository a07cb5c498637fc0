package extproc

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	procv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/prefixmesh/prefixmesh/local"
	"github.com/prefixmesh/prefixmesh/router/extproc/fakegw"
	"github.com/prefixmesh/prefixmesh/routing"
)

// healthLog records the passive-health reports.
type healthLog struct {
	mu      sync.Mutex // guards reports
	reports []string
}

func (h *healthLog) ReportFailure(node string) { h.add("failure " + node) }
func (h *healthLog) ReportSuccess(node string) { h.add("success " + node) }
func (h *healthLog) add(s string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.reports = append(h.reports, s)
}

func (h *healthLog) String() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return strings.Join(h.reports, ", ")
}

// gatedStream is an engine that answers a completion stream in three steps, each held until the
// test opens its gate: the headers, one output token, then the usage (cached_tokens) and [DONE].
type gatedStream struct {
	token, usage chan struct{}
	cached       int
}

func (e *gatedStream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	flush := func() { _ = http.NewResponseController(w).Flush() }
	flush()
	for i, gate := range []chan struct{}{e.token, e.usage} {
		select {
		case <-gate:
		case <-r.Context().Done():
			return
		}
		if i == 0 {
			fmt.Fprint(w, `data: {"id":"cmpl-1","object":"text_completion","model":"prefixmesh-sim","choices":[{"index":0,"text":"a","finish_reason":null}]}`+"\n\n")
		} else {
			fmt.Fprintf(w, `data: {"id":"cmpl-1","object":"text_completion","model":"prefixmesh-sim","choices":[],"usage":{"prompt_tokens":320,"completion_tokens":1,"total_tokens":321,"prompt_tokens_details":{"cached_tokens":%d}}}`+"\n\ndata: [DONE]\n\n", e.cached)
		}
		flush()
	}
}

// TestFallbackMovesAccounting sends a request whose chosen node (node-0, which holds the whole
// prompt in the index) refuses connections, so the gateway falls back to the next endpoint of
// the destination list (node-1, which holds 5 of its 20 blocks). From the response headers on
// node-1 owns the request: it counts the request in flight with its 240 uncached tokens as
// prefill, then no prefill after the first token, and nothing once the response ended; node-0
// holds nothing from the fallback on; the outcome is served_elsewhere; passive health hears a
// failure of node-0 and a success of node-1; and the engine's cached_tokens (80) is compared with
// node-1's estimate at the decision (5 blocks of 16 tokens), not node-0's.
func TestFallbackMovesAccounting(t *testing.T) {
	const prompt, blocks, onServed = 320, 20, 5
	eng := &gatedStream{token: make(chan struct{}), usage: make(chan struct{}), cached: onServed * 16}
	health := &healthLog{}
	r := newRig(t, rigOpts{nodes: 2, dead: 1, engines: map[int]http.Handler{1: eng}, health: health})
	toks := make([]uint32, prompt)
	for i := range toks {
		toks[i] = uint32(1000 + i)
	}
	hashes := local.BlockHashes(toks, 16, 0)
	r.index.ReplaceNode("node-0", 1, 1, hashes)
	r.index.ReplaceNode("node-1", 2, 1, hashes[:onServed])
	_, base := r.gateway(fakegw.Config{RequestMode: procv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseMode: procv3.ProcessingMode_FULL_DUPLEX_STREAMED})
	body, _ := json.Marshal(map[string]any{"model": simModel, "prompt": toks, "max_tokens": 1, "stream": true,
		"stream_options": map[string]any{"include_usage": true}})

	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	type result struct {
		resp *http.Response
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		done <- result{resp, err}
	}()
	dec := r.picker.Decider()
	load := func(node string, want routing.InFlight) func() error {
		return func() error {
			if got := dec.OwnInFlight(node); got != want {
				return fmt.Errorf("%s in flight %+v, want %+v", node, got, want)
			}
			return nil
		}
	}
	// The response headers came through the picker: node-1 has the request, its prefill is the
	// part of the prompt beyond its 5 cached blocks.
	eventually(t, "node-1 owns the request", load("node-1", routing.InFlight{Requests: 1, Tokens: prompt, PrefillTokens: prompt - onServed*16}))
	if err := load("node-0", routing.InFlight{})(); err != nil {
		t.Fatal(err)
	}
	close(eng.token)
	res := <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	defer res.resp.Body.Close()
	if served := res.resp.Header.Get(fakegw.HeaderServed); r.endpointNode(served) != "node-1" || !strings.HasPrefix(res.resp.Header.Get(fakegw.HeaderDestination), endpointOf(r.list.Nodes()[0].EngineURL)+",") {
		t.Fatalf("destination %q, served %q: want node-0 first and node-1 serving", res.resp.Header.Get(fakegw.HeaderDestination), served)
	}
	rd := bufio.NewReader(res.resp.Body)
	line, err := rd.ReadString('\n')
	if err != nil || !strings.Contains(line, `"text":"a"`) {
		t.Fatalf("first line %q: %v", line, err)
	}
	// The picker relayed the token before the gateway wrote it: node-1's prefill is over, the
	// request still in flight.
	if err := load("node-1", routing.InFlight{Requests: 1, Tokens: prompt})(); err != nil {
		t.Fatal(err)
	}
	if err := load("node-0", routing.InFlight{})(); err != nil {
		t.Fatal(err)
	}
	close(eng.usage)
	rest, err := io.ReadAll(rd)
	if err != nil || !strings.HasSuffix(strings.TrimSpace(string(rest)), "data: [DONE]") {
		t.Fatalf("rest of the stream %q: %v", rest, err)
	}
	eventually(t, "the request ended on node-1", func() error {
		if err := load("node-1", routing.InFlight{})(); err != nil {
			return err
		}
		if got := testutil.ToFloat64(r.epp.met.outcomes.WithLabelValues("served_elsewhere")); got != 1 {
			return fmt.Errorf("served_elsewhere %v, want 1", got)
		}
		return nil
	})
	if err := load("node-0", routing.InFlight{}); err() != nil {
		t.Fatal(err())
	}
	if got, want := health.String(), "failure node-0, success node-1"; got != want {
		t.Fatalf("health heard %q, want %q", got, want)
	}
	if seen, exact := r.counter("prefixmesh_extproc_estimate_compared_total"), r.counter("prefixmesh_extproc_estimate_exact_total"); seen != 1 || exact != 1 {
		t.Fatalf("estimate compared on %v requests, exact on %v; want node-1's estimate (%d) compared once, exactly", seen, exact, onServed*16)
	}
	// The prefix is expected on node-1 now (recorded at its first token), nothing pending on node-0.
	if st := dec.Overlay().Stats(); st.Pending != 0 || st.Pairs != blocks-onServed {
		t.Fatalf("overlay %+v, want node-1's %d blocks beyond its summary recorded, nothing pending", st, blocks-onServed)
	}
}
