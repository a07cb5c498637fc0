package loadgen

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// fakeRouter streams a completion and reports as the router would: it "caches" every prompt it
// has seen, so a repeated prompt is fully cached, and it estimates exactly except for prompts
// whose first token is 999 (estimate off by 16).
func fakeRouter(t *testing.T) *httptest.Server {
	t.Helper()
	seen := map[string]bool{}
	var mu = make(chan struct{}, 1)
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body completionBody
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil || !body.Stream {
			http.Error(w, `{"error":{"message":"bad"}}`, http.StatusBadRequest)
			return
		}
		if len(body.Prompt) > 0 && body.Prompt[0] == 500 {
			http.Error(w, `{"error":{"message":"overloaded"}}`, http.StatusTooManyRequests)
			return
		}
		key := fmt.Sprint(body.Prompt)
		mu <- struct{}{}
		cached := 0
		if seen[key] {
			cached = len(body.Prompt)
		}
		seen[key] = true
		<-mu
		est := cached
		if body.Prompt[0] == 999 {
			est = cached + 16
		}
		w.Header().Set("X-Prefixmesh-Node", "n"+fmt.Sprint(len(body.Prompt)%2))
		w.Header().Set("X-Prefixmesh-Estimated-Tokens", fmt.Sprint(est))
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; i < body.MaxTokens; i++ {
			fmt.Fprintf(w, "data: {\"choices\":[{\"text\":\"x\"}]}\n\n")
			w.(http.Flusher).Flush()
		}
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"prompt_tokens_details\":{\"cached_tokens\":%d}}}\n\n", len(body.Prompt), cached)
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
}

func TestRunAndSummarize(t *testing.T) {
	srv := fakeRouter(t)
	defer srv.Close()
	a := []uint32{1, 2, 3, 4}
	b := []uint32{999, 2, 3}
	reqs := []Request{
		{At: 0, Tokens: a, MaxTokens: 3},
		{At: time.Millisecond, Tokens: a, MaxTokens: 3},
		{At: 2 * time.Millisecond, Tokens: b, MaxTokens: 2},
		{At: 3 * time.Millisecond, Tokens: []uint32{500}, MaxTokens: 1},
	}
	var progress atomic.Int32
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := Run(ctx, Config{BaseURL: srv.URL, Model: "m", Concurrency: 1, Progress: func(done, total int) {
		progress.Add(1)
		if total != 4 {
			t.Errorf("total %d", total)
		}
	}}, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if progress.Load() != 4 {
		t.Fatalf("progress called %d times", progress.Load())
	}
	if res[0].Cached != 0 || res[1].Cached != 4 || res[0].Estimate != 0 || res[1].Estimate != 4 {
		t.Fatalf("repeat prompt: %+v / %+v", res[0], res[1])
	}
	if res[2].Estimate != 16 || res[2].Cached != 0 {
		t.Fatalf("off estimate: %+v", res[2])
	}
	if res[3].Err == nil || res[3].Status != http.StatusTooManyRequests || !strings.Contains(res[3].ErrorBody, "overloaded") {
		t.Fatalf("429 not reported: %+v", res[3])
	}
	for _, r := range res[:3] {
		if r.Err != nil || r.TTFT <= 0 || r.TTFT > r.Latency {
			t.Fatalf("bad result %+v", r)
		}
	}
	s := Summarize(res)
	if s.Requests != 4 || s.Errors != 1 || s.PromptTokens != 11 || s.CachedTokens != 4 {
		t.Fatalf("summary %+v", s)
	}
	if want := 2.0 / 3; s.EstimateExact != want {
		t.Fatalf("estimate exact %v, want %v", s.EstimateExact, want)
	}
	if want := 16.0 / 3; s.EstimateMAE != want {
		t.Fatalf("MAE %v, want %v", s.EstimateMAE, want)
	}
	if s.PerNode["n0"]+s.PerNode["n1"] != 3 {
		t.Fatalf("per node %v", s.PerNode)
	}
	var sb strings.Builder
	WriteTable(&sb, []string{"x"}, []Summary{s})
	for _, want := range []string{"prefix hit ratio", "36.4%", "66.7%", "4 (1)"} {
		if !strings.Contains(sb.String(), want) {
			t.Fatalf("table lacks %q:\n%s", want, sb.String())
		}
	}
}

func TestRunCancelled(t *testing.T) {
	srv := fakeRouter(t)
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res, err := Run(ctx, Config{BaseURL: srv.URL}, []Request{{At: time.Hour, Tokens: []uint32{1}}})
	if err == nil || res[0].Err == nil {
		t.Fatalf("cancelled run: err=%v result=%+v", err, res[0])
	}
}

func TestSummarizeEmpty(t *testing.T) {
	if s := Summarize(nil); s.EstimateExact != -1 || s.HitRatio != 0 {
		t.Errorf("empty summary %+v", s)
	}
}
