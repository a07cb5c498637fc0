package frontdoor

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prefixmesh/prefixmesh/router/requests"
)

const okCompletion = `{"object":"text_completion","choices":[{"index":0,"text":"ok","finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2,"prompt_tokens_details":{"cached_tokens":0}}}`

// scriptedUpstream answers generation requests with the statuses of script in turn (the last
// one repeats), and /v1/models with 200 unless sick.
type scriptedUpstream struct {
	script []int
	hits   atomic.Int64
	sick   atomic.Bool
}

func (s *scriptedUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/v1/models" {
		if s.sick.Load() {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		_, _ = io.WriteString(w, `{"object":"list","data":[]}`)
		return
	}
	i := int(s.hits.Add(1)) - 1
	status := s.script[min(i, len(s.script)-1)]
	w.Header().Set("Content-Type", "application/json")
	if status != http.StatusOK {
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"error":{"message":"scripted failure %d","type":"server_error","code":"boom"}}`, i)
		return
	}
	w.Header().Set(requests.HeaderCachedTokens, "0")
	_, _ = io.WriteString(w, okCompletion)
}

// A 5xx before anything reached the client is retried once, on another node.
func TestRetryOnceAfter500(t *testing.T) {
	up := &scriptedUpstream{script: []int{500, 200}}
	srv := httptestServer(t, up)
	f := startFrontDoor(t, []requests.NodeTarget{target("a", srv.URL), target("b", srv.URL)}, fleetOpts{})
	r, err := do(t.Context(), http.DefaultClient, f.srv.URL, "/v1/completions", `{"prompt":"hello"}`, nil)
	if err != nil || r.status != 200 || r.text != "ok" {
		t.Fatalf("got %+v %v", r, err)
	}
	if up.hits.Load() != 2 || counterValue(t, f.reg, "prefixmesh_frontdoor_retries_total") != 1 ||
		counterValue(t, f.reg, "prefixmesh_frontdoor_decisions_total") != 2 {
		t.Fatalf("hits %d, retries %v", up.hits.Load(), counterValue(t, f.reg, "prefixmesh_frontdoor_retries_total"))
	}
	if !strings.Contains(f.logs.String(), `"retries":1`) {
		t.Fatalf("log does not record the retry: %s", f.logs.String())
	}
}

// Only once: when the retry fails too, the client gets the engine's own 5xx answer, after
// exactly two attempts, however many nodes there are.
func TestRetryOnlyOnce(t *testing.T) {
	up := &scriptedUpstream{script: []int{503}}
	srv := httptestServer(t, up)
	f := startFrontDoor(t, []requests.NodeTarget{target("a", srv.URL), target("b", srv.URL), target("c", srv.URL)}, fleetOpts{})
	resp, err := http.Post(f.srv.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	checkError(t, "both fail", resp, http.StatusServiceUnavailable, "boom", "scripted failure 1")
	if up.hits.Load() != 2 {
		t.Fatalf("%d attempts, want 2", up.hits.Load())
	}
}

// A node whose port refuses connections is retried on the next node; with no next node the
// client gets 502.
func TestRetryAfterConnectError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadURL := "http://" + ln.Addr().String()
	ln.Close() // nothing listens there now
	up := &scriptedUpstream{script: []int{200}}
	srv := httptestServer(t, up)
	f := startFrontDoor(t, []requests.NodeTarget{target("dead", deadURL), target("live", srv.URL)}, fleetOpts{})
	for i := range 5 {
		r, err := do(t.Context(), http.DefaultClient, f.srv.URL, "/v1/completions", fmt.Sprintf(`{"prompt":"p%d"}`, i), nil)
		if err != nil || r.status != 200 || r.header.Get(HeaderNode) != "live" {
			t.Fatalf("request %d: %+v %v", i, r, err)
		}
	}
	f2 := startFrontDoor(t, []requests.NodeTarget{target("dead", deadURL)}, fleetOpts{})
	resp, err := http.Post(f2.srv.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	checkError(t, "only node dead", resp, http.StatusBadGateway, codeUpstream, "dead")
}

// Once bytes of a stream reached the client, an upstream failure is not retried: the stream ends
// with an error event.
func TestNoRetryAfterStreamingBegan(t *testing.T) {
	var hits atomic.Int64
	srv := httptestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\"par\"}]}\n\n")
		http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler) // the node dies mid-stream
	}))
	f := startFrontDoor(t, []requests.NodeTarget{target("a", srv.URL), target("b", srv.URL)}, fleetOpts{})
	r, err := do(t.Context(), http.DefaultClient, f.srv.URL, "/v1/completions", `{"prompt":"x","stream":true}`, nil)
	if err == nil || !strings.Contains(err.Error(), "broke off") || r.text != "par" || r.done {
		t.Fatalf("got %+v, %v; want the partial text then an error event", r, err)
	}
	if hits.Load() != 1 {
		t.Fatalf("%d attempts, want 1", hits.Load())
	}
}

// A JSON body cut short by the engine is not passed off as a complete answer: the client's read
// fails.
func TestBodyCutShortAbortsClient(t *testing.T) {
	var hits atomic.Int64
	srv := httptestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "100")
		_, _ = io.WriteString(w, `{"object":`)
		http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler)
	}))
	f := startFrontDoor(t, []requests.NodeTarget{target("a", srv.URL), target("b", srv.URL)}, fleetOpts{})
	resp, err := http.Post(f.srv.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x"}`))
	if err == nil { // the relayed bytes may or may not have reached the client before the abort
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	if err == nil {
		t.Fatal("a truncated body read as complete")
	}
	if hits.Load() != 1 {
		t.Fatalf("%d attempts, want 1", hits.Load())
	}
}

// The engine receives the client's body byte for byte (unknown fields, spacing and all) and the
// end-to-end headers; the client receives the engine's headers plus the routing headers.
func TestForwardsBodyUnchanged(t *testing.T) {
	got := make(chan *http.Request, 1)
	bodies := make(chan []byte, 1)
	srv := httptestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- r
		bodies <- b
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Engine", "yes")
		w.Header().Set(requests.HeaderCachedTokens, "0")
		_, _ = io.WriteString(w, okCompletion)
	}))
	f := startFrontDoor(t, []requests.NodeTarget{target("a", srv.URL)}, fleetOpts{})
	body := "{ \"prompt\" : [1, 2,3],\n \"temperature\": 0.7, \"x_vendor\": {\"k\": [true]} }"
	h := http.Header{"Authorization": {"Bearer sk-test"}, requests.HeaderSessionID: {"conv-9"}, "Accept-Encoding": {"gzip"}}
	r, err := do(t.Context(), http.DefaultClient, f.srv.URL, "/v1/completions", body, h)
	if err != nil || r.status != 200 {
		t.Fatalf("%+v %v", r, err)
	}
	req, b := recv(t, "the upstream request", got), recv(t, "the upstream body", bodies)
	if string(b) != body {
		t.Fatalf("engine got body %q, want %q", b, body)
	}
	if req.Header.Get("Authorization") != "Bearer sk-test" || req.Header.Get(requests.HeaderSessionID) != "conv-9" ||
		req.Header.Get("Accept-Encoding") != "" || req.URL.Path != "/v1/completions" {
		t.Fatalf("engine got %s %v", req.URL.Path, req.Header)
	}
	if r.header.Get("X-Engine") != "yes" || r.header.Get(HeaderNode) != "a" || r.header.Get(HeaderEstimate) != "0" {
		t.Fatalf("client got headers %v", r.header)
	}
}
