package frontdoor

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixmesh/prefixmesh/router/requests"
	"github.com/prefixmesh/prefixmesh/routing"
)

// okEngine answers every request 200 at once.
type okEngine struct{}

func (okEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"id":"x","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
}

// idsBody is a completions body whose prompt is n token ids, built in one allocation.
func idsBody(n int) []byte {
	b := make([]byte, 0, 2*n+64)
	b = append(b, `{"model":"`+simModel+`","max_tokens":1,"prompt":[`...)
	b = append(b, bytes.Repeat([]byte("1,"), n-1)...)
	return append(b, "1]}"...)
}

// A 4M-token prompt (8 MB of ids, under the body cap) is refused with 413 naming the prompt
// token cap, before it is hashed or routed, and counted as too_large.
func TestFrontDoorPromptTokenCap(t *testing.T) {
	eng := httptestServer(t, okEngine{})
	list := &nodeList{}
	list.set([]requests.NodeTarget{target("n0", eng.URL)})
	reg := prometheus.NewRegistry()
	fd, err := New(DefaultConfig(), Deps{Service: newService(t, newPolicyPicker(t, list, routing.NewIndex(routing.DefaultIndexConfig()))), Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	front := httptestServer(t, fd.Handler())
	body := idsBody(4_000_000)
	resp, err := http.Post(front.URL+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e apiError
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
		t.Fatalf("status %d, body not an OpenAI error: %v", resp.StatusCode, err)
	}
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(e.Error.Message, strconv.Itoa(1<<20)) {
		t.Fatalf("4M-token prompt: %d %+v, want 413 naming the cap of %d tokens", resp.StatusCode, e.Error, 1<<20)
	}
	if got := counterWith(t, &fleet{reg: reg}, "prefixmesh_frontdoor_rejected_total", map[string]string{"reason": "too_large"}); got != 1 {
		t.Fatalf("rejected_total{reason=too_large} = %v, want 1", got)
	}
	// A prompt at the cap's scale but within it still routes.
	resp2, err := http.Post(front.URL+"/v1/completions", "application/json", bytes.NewReader(idsBody(1000)))
	if err != nil {
		t.Fatal(err)
	}
	resp2.Body.Close()
	if resp2.StatusCode != http.StatusOK {
		t.Fatalf("a short prompt: %d", resp2.StatusCode)
	}
}

// BenchmarkOversizedPrompt is what a 4M-token prompt costs the front door, handler to answer
// (before the cap: parse, hash, decide and forward 8 MB; with it: the parse up to the cap).
func BenchmarkOversizedPrompt(b *testing.B) {
	eng := httptest.NewServer(okEngine{})
	defer eng.Close()
	list := &nodeList{}
	list.set([]requests.NodeTarget{target("n0", eng.URL)})
	fd, err := New(DefaultConfig(), Deps{Service: newService(b, newPolicyPicker(b, list, routing.NewIndex(routing.DefaultIndexConfig()))), Registry: prometheus.NewRegistry()})
	if err != nil {
		b.Fatal(err)
	}
	h := fd.Handler()
	body := idsBody(4_000_000)
	b.ResetTimer()
	for range b.N {
		r := httptest.NewRequest(http.MethodPost, "/v1/completions", bytes.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
	}
}
