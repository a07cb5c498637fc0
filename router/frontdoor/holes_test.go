package frontdoor

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prefixmesh/prefixmesh/router/requests"
)

// frozenNode accepts TCP connections and never answers, as an engine under SIGSTOP does (the
// kernel still completes the handshake). close releases the connections.
type frozenNode struct {
	ln    net.Listener
	mu    sync.Mutex // guards conns
	conns []net.Conn
	wg    sync.WaitGroup
}

func startFrozenNode(t *testing.T) *frozenNode {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &frozenNode{ln: ln}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.mu.Lock()
			f.conns = append(f.conns, c)
			f.mu.Unlock()
		}
	}()
	t.Cleanup(f.close)
	return f
}

func (f *frozenNode) url() string { return "http://" + f.ln.Addr().String() }

func (f *frozenNode) close() {
	f.ln.Close()
	f.mu.Lock()
	for _, c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

// A client that stalls its body holds its admission slot only until BodyTimeout: it gets 408,
// and the router (at --max-inflight=1) serves the next client.
func TestStalledBodyTimesOut(t *testing.T) {
	f := startFleet(t, fleetOpts{nodes: 1, svc: func(c *requests.Config) { c.MaxInFlight = 1 },
		cfg: func(c *Config) { c.BodyTimeout = 300 * time.Millisecond }})
	conn, err := net.Dial("tcp", strings.TrimPrefix(f.srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Headers and half the body, then nothing.
	fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\":")
	eventually(t, "the stalled upload to take the slot", func() bool { return f.fd.InFlight() == 1 })
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("stalled client got no answer: %v", err)
	}
	checkError(t, "stalled body", resp, http.StatusRequestTimeout, codeBodyTimeout, "did not arrive within")
	r, err := do(t.Context(), http.DefaultClient, f.srv.URL, "/v1/completions", `{"prompt":"next","max_tokens":2}`, nil)
	if err != nil || r.status != http.StatusOK {
		t.Fatalf("the next client: %+v %v", r, err)
	}
	if got := counterValue(t, f.reg, "prefixmesh_frontdoor_rejected_total"); got != 1 {
		t.Fatalf("rejected_total %v, want 1 (body_timeout)", got)
	}
}

// A node that freezes (accepts, never answers) costs a streaming request one first-byte
// deadline, after which it is retried on a healthy node; after EjectAfter timeouts the frozen
// node is ejected as a node that refuses connections is, and new requests no longer reach it.
func TestFrozenNodeFirstByteTimeout(t *testing.T) {
	frozen := startFrozenNode(t)
	good := startSimNode(t, "good", fastEngineConfig())
	f := startFrontDoor(t, []requests.NodeTarget{target("frozen", frozen.url()), target("good", good.srv.URL)},
		fleetOpts{policy: "round-robin", cfg: func(c *Config) { c.FirstByteFloor = 200 * time.Millisecond; c.FirstByteCeiling = time.Second }})
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	for i := range 6 {
		start := time.Now()
		r, err := do(ctx, http.DefaultClient, f.srv.URL, "/v1/completions", fmt.Sprintf(`{"prompt":"p%d","max_tokens":2,"stream":true}`, i), nil)
		if err != nil || r.status != http.StatusOK || !r.done {
			t.Fatalf("request %d: %+v %v", i, r, err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("request %d took %v behind a frozen node", i, d)
		}
	}
	timeouts := counterValue(t, f.reg, "prefixmesh_frontdoor_first_byte_timeouts_total")
	if timeouts != 3 {
		t.Fatalf("first-byte timeouts %v, want 3 (EjectAfter) before the node is ejected", timeouts)
	}
	if !f.health.Ejected("frozen") || counterValue(t, f.reg, "prefixmesh_frontdoor_ejections_total") != 1 {
		t.Fatal("the frozen node was not ejected")
	}
	if got := retriesByCause(t, f, causeFirstByte); got != 3 {
		t.Fatalf("retries on first_byte_timeout %v, want 3", got)
	}
}

// retriesByCause reads retries_total{cause}.
func retriesByCause(t *testing.T, f *fleet, cause string) float64 {
	t.Helper()
	mfs, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "prefixmesh_frontdoor_retries_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "cause" && l.GetValue() == cause {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// An engine that answers 429 (without Retry-After) is retried on a node with room; when every
// node answers 429 the client sees the 429, with Retry-After. A busy node is not ejected.
func TestEngine429RetriedElsewhere(t *testing.T) {
	busy := &scriptedUpstream{script: []int{http.StatusTooManyRequests}}
	ok := &scriptedUpstream{script: []int{http.StatusOK}}
	f := startFrontDoor(t, []requests.NodeTarget{target("busy", httptestServer(t, busy).URL), target("ok", httptestServer(t, ok).URL)},
		fleetOpts{policy: "round-robin"})
	for i := range 4 {
		r, err := do(t.Context(), http.DefaultClient, f.srv.URL, "/v1/completions", fmt.Sprintf(`{"prompt":"q%d"}`, i), nil)
		if err != nil || r.status != http.StatusOK {
			t.Fatalf("request %d: %+v %v", i, r, err)
		}
	}
	if busy.hits.Load() == 0 || retriesByCause(t, f, causeStatus429) != float64(busy.hits.Load()) {
		t.Fatalf("busy hits %d, 429 retries %v", busy.hits.Load(), retriesByCause(t, f, causeStatus429))
	}
	if f.health.Ejected("busy") {
		t.Fatal("a node answering 429 was ejected")
	}

	both := &scriptedUpstream{script: []int{http.StatusTooManyRequests}}
	g := startFrontDoor(t, []requests.NodeTarget{target("a", httptestServer(t, both).URL), target("b", httptestServer(t, both).URL)}, fleetOpts{})
	resp, err := http.Post(g.srv.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" || both.hits.Load() != 2 {
		t.Fatalf("status %d, Retry-After %q, hits %d", resp.StatusCode, resp.Header.Get("Retry-After"), both.hits.Load())
	}
	resp.Body.Close()
}

// stallingStream sends its headers and one chunk, then nothing until the request ends.
type stallingStream struct{}

func (stallingStream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/v1/models" {
		_, _ = io.WriteString(w, `{"object":"list","data":[]}`)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	_, _ = io.WriteString(w, "data: {\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\"first\"}]}\n\n")
	http.NewResponseController(w).Flush()
	<-r.Context().Done()
}

// A stream that goes quiet is cut at StreamIdleTimeout: the client gets an SSE error event, the
// metrics a broken stream by node and cause, the log a WARN line.
func TestIdleStreamCut(t *testing.T) {
	f := startFrontDoor(t, []requests.NodeTarget{target("n", httptestServer(t, stallingStream{}).URL)},
		fleetOpts{cfg: func(c *Config) { c.StreamIdleTimeout = 200 * time.Millisecond }})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err := do(ctx, http.DefaultClient, f.srv.URL, "/v1/completions", `{"prompt":"x","stream":true}`, nil)
	if err == nil || !strings.Contains(err.Error(), "stream error event") || !strings.Contains(err.Error(), "sent nothing") {
		t.Fatalf("client saw %v, want an SSE error event", err)
	}
	if got := brokenByCause(t, f, "n", causeIdle); got != 1 {
		t.Fatalf("broken_streams{n,idle_timeout} = %v", got)
	}
	eventually(t, "the WARN line", func() bool {
		return strings.Contains(f.logs.String(), `"level":"WARN"`) && strings.Contains(f.logs.String(), `"broken":"idle_timeout"`)
	})
	// requests_total keeps the 200 the client saw and names the cut in outcome, never "complete".
	eventually(t, "requests_total{outcome=idle_timeout}", func() bool {
		return counterWith(t, f, "prefixmesh_frontdoor_requests_total", map[string]string{"endpoint": "completions", "code": "200", "outcome": causeIdle}) == 1
	})
	if n := counterWith(t, f, "prefixmesh_frontdoor_requests_total", map[string]string{"endpoint": "completions", "outcome": outcomeComplete}); n != 0 {
		t.Fatalf("requests_total{outcome=complete} = %v for a cut stream", n)
	}
}

func brokenByCause(t *testing.T, f *fleet, node, cause string) float64 {
	t.Helper()
	return counterWith(t, f, "prefixmesh_frontdoor_broken_streams_total", map[string]string{"node": node, "cause": cause})
}

// counterWith is the value of the counter name whose labels include want (0 when there is none).
func counterWith(t *testing.T, f *fleet, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := 0
			for _, l := range m.GetLabel() {
				if v, ok := want[l.GetName()]; ok && v == l.GetValue() {
					match++
				}
			}
			if match == len(want) {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// A hostile body, 9,999 nested one-element arrays as the prompt, is refused at the third
// level (400 naming prompt[0]), both by the front door and by the engine behind it; the parser's
// linearity itself is checked by internal/openai's step-counting fuzz target.
func TestNestedPromptRefused(t *testing.T) {
	f := startFleet(t, fleetOpts{nodes: 1})
	body := `{"prompt":` + strings.Repeat("[", 9999) + "1" + strings.Repeat("]", 9999) + `}`
	for _, base := range []string{f.srv.URL, f.nodes[0].srv.URL} {
		resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		checkError(t, base, resp, http.StatusBadRequest, codeInvalid, "nest at most two levels")
	}
}

// headersThenSilence sends its response headers at once and then nothing, as a vLLM whose HTTP
// server runs while its engine core hangs.
type headersThenSilence struct{}

func (headersThenSilence) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/v1/models" {
		_, _ = io.WriteString(w, `{"object":"list","data":[]}`)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	http.NewResponseController(w).Flush()
	<-r.Context().Done()
}

// The first-byte deadline covers the first byte of the body, not just the headers: nothing has
// reached the client yet, so the request is retried on a healthy node.
func TestHeadersThenSilenceRetried(t *testing.T) {
	good := startSimNode(t, "good", fastEngineConfig())
	f := startFrontDoor(t, []requests.NodeTarget{target("mute", httptestServer(t, headersThenSilence{}).URL), target("good", good.srv.URL)},
		fleetOpts{policy: "round-robin", cfg: func(c *Config) { c.FirstByteFloor = 200 * time.Millisecond; c.FirstByteCeiling = time.Second }})
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	for i := range 2 {
		r, err := do(ctx, http.DefaultClient, f.srv.URL, "/v1/completions", fmt.Sprintf(`{"prompt":"h%d","max_tokens":2,"stream":true}`, i), nil)
		if err != nil || r.status != http.StatusOK || !r.done || r.header.Get(HeaderNode) != "good" {
			t.Fatalf("request %d: %+v %v", i, r, err)
		}
	}
	if got := retriesByCause(t, f, causeFirstByte); got < 1 || got != counterValue(t, f.reg, "prefixmesh_frontdoor_first_byte_timeouts_total") {
		t.Fatalf("first-byte retries %v, timeouts %v", got, counterValue(t, f.reg, "prefixmesh_frontdoor_first_byte_timeouts_total"))
	}
}
