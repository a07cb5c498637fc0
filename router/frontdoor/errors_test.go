package frontdoor

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prefixmesh/prefixmesh/router/requests"
)

// checkError asserts an OpenAI-shaped error with the status and a message containing msg.
func checkError(t *testing.T, what string, resp *http.Response, status int, code, msg string) {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	var e apiError
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("%s: body %q is not an OpenAI error: %v", what, b, err)
	}
	if resp.StatusCode != status || e.Error.Type == "" || e.Error.Code == "" || !strings.Contains(e.Error.Message, msg) ||
		(code != "" && e.Error.Code != code) {
		t.Fatalf("%s: %d %+v, want %d %q containing %q", what, resp.StatusCode, e.Error, status, code, msg)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("%s: content type %q", what, ct)
	}
}

// Client errors are answered by the front door itself, OpenAI-shaped, naming what was wrong.
func TestClientErrors(t *testing.T) {
	f := startFleet(t, fleetOpts{nodes: 1})
	big := `{"prompt":"` + strings.Repeat("x", MaxBodyBytes) + `"}`
	cases := []struct {
		name, method, path, body string
		status                   int
		code, msg                string
	}{
		{"bad json", "POST", "/v1/completions", `{"prompt": "x"`, 400, codeInvalid, "invalid JSON"},
		{"not an object", "POST", "/v1/completions", `[1,2]`, 400, codeInvalid, "must be a JSON object"},
		{"trailing data", "POST", "/v1/completions", `{"prompt":"x"} {}`, 400, codeInvalid, "trailing"},
		{"no prompt", "POST", "/v1/completions", `{"max_tokens": 3}`, 400, codeInvalid, `prompt is required`},
		{"zero max_tokens", "POST", "/v1/completions", `{"prompt": "x", "max_tokens": 0}`, 400, codeInvalid, "max_tokens must be at least 1, got 0"},
		{"null id", "POST", "/v1/completions", `{"prompt": [1, null]}`, 400, codeInvalid, "prompt[1]"},
		{"nested too deep", "POST", "/v1/completions", `{"prompt": [[[1]]]}`, 400, codeInvalid, "nest at most two levels"},
		{"id out of range", "POST", "/v1/completions", `{"prompt": [4294967296]}`, 400, codeInvalid, "not a token id"},
		{"empty prompt", "POST", "/v1/completions", `{"prompt": ""}`, 400, codeInvalid, `prompt is empty`},
		{"prompt type", "POST", "/v1/completions", `{"prompt": {"a": 1}}`, 400, codeInvalid, `prompt must be`},
		{"negative id", "POST", "/v1/completions", `{"prompt": [1, -2]}`, 400, codeInvalid, "prompt[1]"},
		{"mixed batch", "POST", "/v1/completions", `{"prompt": ["a", [1]]}`, 400, codeInvalid, "prompt[1]"},
		{"stream type", "POST", "/v1/completions", `{"prompt": "x", "stream": "yes"}`, 400, codeInvalid, `stream: expected a boolean, got string`},
		{"no messages", "POST", "/v1/chat/completions", `{"model":"prefixmesh-sim"}`, 400, codeInvalid, `messages is required`},
		{"bad role", "POST", "/v1/chat/completions", `{"messages":[{"role":"a|b","content":"x"}]}`, 400, codeInvalid, "messages[0].role"},
		{"image part", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}`, 400, codeInvalid, "text parts"},
		{"adapter not numeric", "POST", "/v1/completions", `{"model":"prefixmesh-sim:abc","prompt":"x"}`, 400, codeInvalid, "decimal id"},
		{"adapter contradiction", "POST", "/v1/completions", `{"model":"prefixmesh-sim:3","adapter_id":4,"prompt":"x"}`, 400, codeInvalid, "contradicts"},
		{"unknown model", "POST", "/v1/completions", `{"model":"gpt-5","prompt":"x"}`, 404, codeModelNotFound, "gpt-5"},
		{"unknown path", "POST", "/v1/embeddings", `{}`, 404, codeNotFound, "/v1/embeddings"},
		{"wrong method", "GET", "/v1/completions", ``, 405, codeMethod, "use POST"},
		{"wrong method models", "POST", "/v1/models", `{}`, 405, codeMethod, "use GET"},
		{"too large", "POST", "/v1/completions", big, 413, codeTooLarge, "exceeds 8388608 bytes"},
		{"not JSON", "POST", "/v1/completions", `prompt=x`, 415, "unsupported_media_type", "must be application/json"},
	}
	for _, c := range cases {
		req, err := http.NewRequest(c.method, f.srv.URL+c.path, strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		if c.status != 415 {
			req.Header.Set("Content-Type", "application/json")
		} else {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		checkError(t, c.name, resp, c.status, c.code, c.msg)
	}
	// An adapter the engine's name scheme selects is routed (and served).
	r, err := do(t.Context(), http.DefaultClient, f.srv.URL, "/v1/completions", `{"model":"prefixmesh-sim:7","prompt":"x","max_tokens":1}`, nil)
	if err != nil || r.status != 200 {
		t.Fatalf("adapter request: %+v %v", r, err)
	}
}

// blockingUpstream answers every generation request only when released, counting arrivals.
type blockingUpstream struct {
	arrived atomic.Int64
	release chan struct{}
	once    sync.Once
}

func newBlockingUpstream() *blockingUpstream { return &blockingUpstream{release: make(chan struct{})} }

func (b *blockingUpstream) open() { b.once.Do(func() { close(b.release) }) }

func (b *blockingUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/v1/models" {
		_, _ = io.WriteString(w, `{"object":"list","data":[]}`)
		return
	}
	b.arrived.Add(1)
	select {
	case <-b.release:
	case <-r.Context().Done():
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set(requests.HeaderCachedTokens, "0")
	_, _ = io.WriteString(w, `{"object":"text_completion","choices":[{"index":0,"text":"ok","finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2,"prompt_tokens_details":{"cached_tokens":0}}}`)
}

// Overload is answered 429 at once: by the router's own in-flight cap and by the per-node cap.
func TestOverload429(t *testing.T) {
	for _, c := range []struct {
		name string
		o    fleetOpts
		code string
	}{
		{"router cap", fleetOpts{svc: func(c *requests.Config) { c.MaxInFlight = 1 }}, codeOverloaded},
		{"node cap", fleetOpts{pickerCfg: requests.PolicyPickerConfig{MaxInFlightPerNode: 1}}, codeOverloaded},
	} {
		t.Run(c.name, func(t *testing.T) {
			up := newBlockingUpstream()
			srv := httptestServer(t, up)
			f := startFrontDoor(t, []requests.NodeTarget{target("n0", srv.URL)}, c.o)
			first := make(chan *result, 1)
			go func() {
				r, _ := do(t.Context(), http.DefaultClient, f.srv.URL, "/v1/completions", `{"prompt":"a"}`, nil)
				first <- r
			}()
			eventually(t, "the first request to reach the upstream", func() bool { return up.arrived.Load() == 1 })
			start := time.Now()
			req, _ := http.NewRequest(http.MethodPost, f.srv.URL+"/v1/completions", strings.NewReader(`{"prompt":"b"}`))
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if resp.Header.Get("Retry-After") == "" {
				t.Error("429 without Retry-After")
			}
			checkError(t, c.name, resp, http.StatusTooManyRequests, c.code, "")
			if d := time.Since(start); d > 2*time.Second {
				t.Fatalf("429 took %v", d)
			}
			up.open()
			if r := recv(t, "the first request", first); r == nil || r.status != 200 {
				t.Fatalf("first request: %+v", r)
			}
			if got := counterValue(t, f.reg, "prefixmesh_frontdoor_rejected_total"); got != 1 {
				t.Fatalf("rejected_total %v, want 1", got)
			}
		})
	}
}

// With no node able to serve, the answer is 503.
func TestNoNodes503(t *testing.T) {
	dead := target("dead", "http://127.0.0.1:1")
	dead.Info.Alive = false
	draining := target("draining", "http://127.0.0.1:1")
	draining.Info.Draining = true
	for _, c := range []struct {
		name    string
		targets []requests.NodeTarget
	}{{"empty", nil}, {"none alive", []requests.NodeTarget{dead, draining}}} {
		f := startFrontDoor(t, c.targets, fleetOpts{})
		resp, err := http.Post(f.srv.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x"}`))
		if err != nil {
			t.Fatal(err)
		}
		checkError(t, c.name, resp, http.StatusServiceUnavailable, codeNoNodes, "no node")
	}
}
