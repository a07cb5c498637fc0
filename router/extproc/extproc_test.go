package extproc

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"

	procv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/prefixmesh/prefixmesh/router/extproc/fakegw"
)

// longPrompt is a text prompt of a few hundred tokens, distinct per seed.
func longPrompt(seed int) string {
	var b strings.Builder
	for i := range 40 {
		fmt.Fprintf(&b, "Conversation %d, turn %d: which node caches the longest prefix of this prompt? ", seed, i)
	}
	return b.String()
}

// cachedTokens reads usage.prompt_tokens_details.cached_tokens from a JSON body or the last SSE
// chunk that has it; -1 when absent.
func cachedTokens(t *testing.T, body string) int {
	t.Helper()
	read := func(s string) int {
		var u struct {
			Usage *struct {
				Details *struct {
					Cached int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if json.Unmarshal([]byte(s), &u) != nil || u.Usage == nil || u.Usage.Details == nil {
			return -1
		}
		return u.Usage.Details.Cached
	}
	if !strings.HasPrefix(body, "data:") {
		return read(body)
	}
	got := -1
	for _, line := range strings.Split(body, "\n") {
		if p, ok := strings.CutPrefix(line, "data: "); ok {
			if c := read(p); c >= 0 {
				got = c
			}
		}
	}
	return got
}

// TestRoutesThroughGateway drives the picker as Envoy does in each body mode, with the request
// body split at awkward offsets: the destination header equals the dynamic metadata, the body
// reaches the engine unchanged with a true Content-Length, the response comes back unchanged
// (streamed or not), a repeated prompt lands on the node that holds it, and the estimate equals
// the cached_tokens the engine reports (the simulated engine's rule is vLLM's).
func TestRoutesThroughGateway(t *testing.T) {
	splits := [][]int{{1}, {7, 4093}, {62001}, {3, 1 << 20}}
	for mi, m := range modes {
		for si, chunks := range splits {
			if m.req != procv3.ProcessingMode_FULL_DUPLEX_STREAMED && si > 0 {
				continue // one body message: no splits
			}
			t.Run(fmt.Sprintf("%s/split-%d", m.name, si), func(t *testing.T) {
				r := newRig(t, rigOpts{})
				g, base := r.gateway(fakegw.Config{RequestMode: m.req, ResponseMode: m.resp, NoProtocolConfig: m.noConfig, Chunks: chunks})
				if m.noConfig {
					// No protocol_config: the picker assumes its configured default,
					// FULL_DUPLEX_STREAMED, which is what this gateway speaks.
					_ = mi
				}
				sent := 0
				for _, stream := range []bool{false, true} {
					p := longPrompt(si*10 + mi)
					if stream {
						p = "(streamed) " + p
					}
					req := map[string]any{"model": simModel, "prompt": p, "max_tokens": 3}
					if stream {
						req["stream"], req["stream_options"] = true, map[string]any{"include_usage": true}
					}
					body, _ := json.Marshal(req)
					var firstNode string
					for round := range 2 {
						sent++
						code, h, out := post(t, base, "/v1/completions", string(body))
						if code != http.StatusOK {
							t.Fatalf("round %d: %d %s", round, code, out)
						}
						d := decision(t, g, sent)
						if d.Destination != d.Metadata || d.Destination != h.Get(fakegw.HeaderDestination) {
							t.Fatalf("destination header %q, metadata %q", d.Destination, d.Metadata)
						}
						if !d.BodyIntact {
							t.Fatal("the body reached the engine changed")
						}
						if m.req == procv3.ProcessingMode_FULL_DUPLEX_STREAMED && d.ContentLength != strconv.Itoa(len(body)) {
							t.Fatalf("Content-Length %q, body %d bytes", d.ContentLength, len(body))
						}
						eps := strings.Split(d.Destination, ",")
						if len(eps) != 3 || d.Served != eps[0] {
							t.Fatalf("destination %q (want the pick and 2 fallbacks), served %q", d.Destination, d.Served)
						}
						if stream != strings.HasPrefix(out, "data: ") || (stream && !strings.HasSuffix(strings.TrimSpace(out), "data: [DONE]")) {
							t.Fatalf("stream %v: body %q", stream, out)
						}
						node := r.endpointNode(d.Served)
						cached := cachedTokens(t, out)
						if round == 0 {
							firstNode = node
							if cached != 0 {
								t.Fatalf("first time: cached_tokens %d", cached)
							}
						} else {
							if node != firstNode {
								t.Fatalf("repeated prompt went to %s, first to %s", node, firstNode)
							}
							if cached <= 0 {
								t.Fatalf("repeated prompt: cached_tokens %d", cached)
							}
						}
						r.syncIndex()
					}
				}
				// The picker ends a request once it has echoed the response's last chunk, which may
				// be just after the client read it.
				eventually(t, "every pick ended", func() error {
					if n := r.inFlight(); n != 0 {
						return fmt.Errorf("%d in flight", n)
					}
					if seen := r.counter("prefixmesh_extproc_estimate_compared_total"); seen != 4 {
						return fmt.Errorf("%v requests compared", seen)
					}
					return nil
				})
				if seen, exact := r.counter("prefixmesh_extproc_estimate_compared_total"), r.counter("prefixmesh_extproc_estimate_exact_total"); exact != seen {
					t.Fatalf("estimate == cached_tokens on %v of %v requests; want all", exact, seen)
				}
			})
		}
	}
}

// TestHeadersOnlyAndNonOpenAI routes a request without a body, and bodies that are not OpenAI
// generation requests, by load: never refused by the picker, the engine answers them.
func TestHeadersOnlyAndNonOpenAI(t *testing.T) {
	r := newRig(t, rigOpts{})
	g, base := r.gateway(fakegw.Config{RequestMode: procv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseMode: procv3.ProcessingMode_FULL_DUPLEX_STREAMED})
	code, _, out := post(t, base, "/v1/models", "")
	if code != http.StatusOK || !strings.Contains(out, simModel) {
		t.Fatalf("GET /v1/models through the gateway: %d %s", code, out)
	}
	for i, c := range []struct{ path, body string }{
		{"/v1/completions", "this is not json"},
		{"/v1/completions", `{"model":"no-such-model","prompt":"hi"}`},
		{"/v1/embeddings", `{"model":"prefixmesh-sim","input":"hi"}`},
	} {
		code, _, out := post(t, base, c.path, c.body)
		if d := decision(t, g, i+2); d.Immediate || d.Served == "" {
			t.Fatalf("%s %q: the picker refused it (%+v)", c.path, c.body, d)
		}
		if code == http.StatusOK || code >= 500 {
			t.Fatalf("%s %q: the engine should have answered 4xx, got %d %s", c.path, c.body, code, out)
		}
	}
	if got := testutil.ToFloat64(r.epp.met.decisions.WithLabelValues("load")); got != 4 { // counted before the answer
		t.Fatalf("%v decisions by load, want 4", got)
	}
}

// TestBufferedLargeBody sends a BUFFERED body well over gRPC's default 4 MiB message limit.
func TestBufferedLargeBody(t *testing.T) {
	r := newRig(t, rigOpts{})
	g, base := r.gateway(fakegw.Config{RequestMode: procv3.ProcessingMode_BUFFERED, ResponseMode: procv3.ProcessingMode_BUFFERED})
	body := `{"model":"prefixmesh-sim","input":"` + strings.Repeat("x", 6<<20) + `"}`
	code, _, _ := post(t, base, "/v1/embeddings", body)
	if d := decision(t, g, 1); d.Immediate || d.Served == "" || !d.BodyIntact || code == http.StatusInternalServerError {
		t.Fatalf("6 MiB buffered body: status %d, %+v", code, d)
	}
}

// TestSubsetHint chooses only from the gateway's subset, and answers 503 when no endpoint of it
// is eligible.
func TestSubsetHint(t *testing.T) {
	r := newRig(t, rigOpts{})
	only := endpointOf(r.list.Nodes()[2].EngineURL)
	g, base := r.gateway(fakegw.Config{RequestMode: procv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseMode: procv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		Subset: []string{only}})
	for i := range 5 {
		body, _ := json.Marshal(map[string]any{"model": simModel, "prompt": longPrompt(100 + i), "max_tokens": 2})
		if code, _, out := post(t, base, "/v1/completions", string(body)); code != http.StatusOK {
			t.Fatalf("%d %s", code, out)
		}
		if d := decision(t, g, i+1); d.Destination != only || d.Served != only {
			t.Fatalf("subset %q: destination %q served %q", only, d.Destination, d.Served)
		}
	}
	_, base = r.gateway(fakegw.Config{RequestMode: procv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseMode: procv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		Subset: []string{"10.9.9.9:8000"}})
	code, h, out := post(t, base, "/v1/completions", `{"model":"prefixmesh-sim","prompt":"hi"}`)
	if code != http.StatusServiceUnavailable || h.Get("Retry-After") == "" || !strings.Contains(out, "no_nodes_available") {
		t.Fatalf("subset of unknown endpoints: %d %v %s", code, h, out)
	}
	_, base = r.gateway(fakegw.Config{RequestMode: procv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseMode: procv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		Subset: []string{}})
	if code, _, out := post(t, base, "/v1/completions", `{"model":"prefixmesh-sim","prompt":"hi"}`); code != http.StatusServiceUnavailable {
		t.Fatalf("empty subset: %d %s", code, out)
	}
}

// TestFallback sends requests whose chosen node refuses connections: the gateway goes down the
// destination list, the picker hears the served endpoint, counts the request as served
// elsewhere and gives the chosen node's in-flight count back.
func TestFallback(t *testing.T) {
	r := newRig(t, rigOpts{nodes: 2, dead: 1})
	g, base := r.gateway(fakegw.Config{RequestMode: procv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseMode: procv3.ProcessingMode_FULL_DUPLEX_STREAMED})
	dead := endpointOf(r.list.Nodes()[0].EngineURL)
	fellBack := 0
	for i := 0; i < 40 && fellBack < 3; i++ {
		body, _ := json.Marshal(map[string]any{"model": simModel, "prompt": longPrompt(1000 + i), "max_tokens": 2})
		code, _, out := post(t, base, "/v1/completions", string(body))
		if code != http.StatusOK {
			t.Fatalf("%d %s", code, out)
		}
		if d := decision(t, g, i+1); strings.HasPrefix(d.Destination, dead+",") {
			if d.Served == dead || d.Served == "" {
				t.Fatalf("destination %q served by %q", d.Destination, d.Served)
			}
			fellBack++
		}
	}
	if fellBack == 0 {
		t.Fatal("the dead node was never chosen first in 40 requests")
	}
	eventually(t, "every pick ended", func() error {
		if n := r.inFlight(); n != 0 {
			return fmt.Errorf("%d in flight", n)
		}
		if got := testutil.ToFloat64(r.epp.met.outcomes.WithLabelValues("served_elsewhere")); got != float64(fellBack) {
			return fmt.Errorf("served_elsewhere %v, want %d", got, fellBack)
		}
		return nil
	})
}
