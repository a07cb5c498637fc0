package simengine

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixmesh/prefixmesh/internal/tokenizer"
	"github.com/prefixmesh/prefixmesh/local"
)

// testEngine is an engine served by an httptest server on 127.0.0.1:0.
type testEngine struct {
	*Engine
	srv   *httptest.Server
	cache *local.RadixTree
	reg   *prometheus.Registry
}

// fastConfig makes simulated time negligible unless a test slows a rate down on purpose.
func fastConfig() Config {
	cfg := DefaultConfig()
	cfg.Tokenizer = tokenizer.Bytes
	cfg.KVBlocks = 4096
	cfg.PrefillTokensPerSec = 1e9
	cfg.DecodeTokensPerSec = 1e9
	return cfg
}

func startEngine(t *testing.T, cfg Config) *testEngine {
	t.Helper()
	cache := local.NewRadixTree(local.Options{})
	reg := prometheus.NewRegistry()
	e, err := New(cfg, cache, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(e.Handler())
	t.Cleanup(srv.Close) // runs after e.Close: Close ends the requests srv.Close waits for
	t.Cleanup(e.Close)
	return &testEngine{Engine: e, srv: srv, cache: cache, reg: reg}
}

// post sends body (marshalled unless it is a string or []byte) and returns the response and body.
func (te *testEngine) post(t *testing.T, path string, body any) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Post(te.srv.URL+path, "application/json", bytes.NewReader(toJSON(t, body)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

func toJSON(t *testing.T, body any) []byte {
	t.Helper()
	switch b := body.(type) {
	case string:
		return []byte(b)
	case []byte:
		return b
	}
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// stream is a parsed SSE response.
type stream struct {
	header    http.Header
	chunks    []response // every data event before [DONE]
	done      bool       // saw data: [DONE]
	firstText time.Duration
	text      string // concatenated text or delta content
}

// openStream starts a streaming request and returns the response with its body unread.
func (te *testEngine) openStream(t *testing.T, ctx context.Context, path string, body any) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, te.srv.URL+path, bytes.NewReader(toJSON(t, body)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("stream: status %d, content type %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	return resp
}

// readStream parses a whole SSE stream strictly: every event is one "data: " line followed by a
// blank line, every payload but the last is a JSON chunk, the last is [DONE]. firstText is the
// time from start to the first chunk carrying text.
func readStream(t *testing.T, resp *http.Response, start time.Time) *stream {
	t.Helper()
	defer resp.Body.Close()
	s := &stream{header: resp.Header}
	r := bufio.NewReader(resp.Body)
	for {
		line, err := r.ReadString('\n')
		if err == io.EOF && line == "" {
			break
		}
		if err != nil {
			t.Fatalf("read stream: %v", err)
		}
		if s.done {
			t.Fatalf("data after [DONE]: %q", line)
		}
		payload, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("line %q is not a data line", line)
		}
		if blank, _ := r.ReadString('\n'); blank != "\n" {
			t.Fatalf("event not followed by a blank line: %q", blank)
		}
		payload = strings.TrimSuffix(payload, "\n")
		if payload == "[DONE]" {
			s.done = true
			continue
		}
		var c response
		if err := json.Unmarshal([]byte(payload), &c); err != nil {
			t.Fatalf("chunk %q: %v", payload, err)
		}
		for _, ch := range c.Choices {
			piece := ""
			switch {
			case ch.Text != nil:
				piece = *ch.Text
			case ch.Delta != nil:
				piece = ch.Delta.Content
			}
			if piece != "" && s.firstText == 0 {
				s.firstText = time.Since(start)
			}
			s.text += piece
		}
		s.chunks = append(s.chunks, c)
	}
	if !s.done {
		t.Fatal("stream ended without data: [DONE]")
	}
	return s
}

func (te *testEngine) streamAll(t *testing.T, path string, body any) *stream {
	t.Helper()
	start := time.Now()
	return readStream(t, te.openStream(t, t.Context(), path, body), start)
}

// eventually polls cond until it holds or 10 s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func decodeResponse(t *testing.T, b []byte) response {
	t.Helper()
	var r response
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("response %s: %v", b, err)
	}
	return r
}

// checkDrained verifies, once nothing runs, that the pool is consistent and that evicting the
// whole cache returns every block.
func (te *testEngine) checkDrained(t *testing.T) {
	t.Helper()
	eventually(t, "all requests to finish", func() bool { l := te.Load(); return l.Running == 0 && l.Waiting == 0 })
	te.mu.Lock()
	defer te.mu.Unlock()
	if err := te.pool.Check(); err != nil {
		t.Fatal(err)
	}
	if st := te.pool.Stats(); st.Violations != 0 {
		t.Fatalf("%d cache contract violations", st.Violations)
	}
	if te.pendingPrefill != 0 {
		t.Fatalf("queued prefill tokens %d with nothing running", te.pendingPrefill)
	}
	if free := te.pool.Reclaim(te.cfg.KVBlocks); free != te.cfg.KVBlocks {
		t.Fatalf("leak: %d of %d blocks free after evicting the whole cache", free, te.cfg.KVBlocks)
	}
}

func tokenPrompt(n int, base uint32) []uint32 {
	p := make([]uint32, n)
	for i := range p {
		p[i] = base + uint32(i)
	}
	return p
}
