package simengine

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prefixmesh/prefixmesh/internal/openai"
	"github.com/prefixmesh/prefixmesh/internal/tokenizer"
)

// The same 4,100-token prompt again: a repeat reuses the 256 cached full blocks (4,096 tokens,
// the prompt floored to the block) and, at a slow 10k tok/s prefill, reaches its first token in
// well under half the time of the first. The warm TTFT is the best of three repeats, so that a
// scheduling hiccup on a loaded machine cannot fail the ratio.
func TestRepeatPromptReusesCacheAndCutsTTFT(t *testing.T) {
	cfg := fastConfig()
	cfg.PrefillTokensPerSec = 10000 // an uncached 4,100-token prefill takes 410 ms
	te := startEngine(t, cfg)
	body := map[string]any{"prompt": tokenPrompt(4100, 1000), "max_tokens": 4, "stream": true,
		"stream_options": map[string]any{"include_usage": true}}

	var cold, warm time.Duration
	for i, wantCached := range []int{0, 4096, 4096, 4096} {
		s := te.streamAll(t, "/v1/completions", body)
		if i == 0 {
			cold = s.firstText
		} else if warm == 0 || s.firstText < warm {
			warm = s.firstText
		}
		if got := s.header.Get(HeaderCachedTokens); got != strconv.Itoa(wantCached) {
			t.Fatalf("request %d: %s = %q, want %d", i, HeaderCachedTokens, got, wantCached)
		}
		u := s.chunks[len(s.chunks)-1].Usage
		if u == nil || u.PromptTokensDetails.CachedTokens != wantCached || u.PromptTokens != 4100 || u.CompletionTokens != 4 {
			t.Fatalf("request %d: usage %+v, want cached %d of 4100, 4 completion", i, u, wantCached)
		}
	}
	t.Logf("TTFT cold %v, warm %v", cold, warm)
	if warm >= cold/2 {
		t.Fatalf("warm TTFT %v is not under half the cold %v", warm, cold)
	}
	// Non-streaming reports the same in usage.
	body["stream"], body["stream_options"] = false, nil
	delete(body, "stream_options")
	resp, b := te.post(t, "/v1/completions", body)
	if r := decodeResponse(t, b); resp.StatusCode != 200 || r.Usage.PromptTokensDetails.CachedTokens != 4096 {
		t.Fatalf("non-streaming: %d %s", resp.StatusCode, b)
	}
	if got := te.cache.PeekMatchedTokens(tokenPrompt(4100, 1000), cfg.BlockSize, 0); got != 4096 {
		t.Fatalf("peek %d, want 4096", got)
	}
	for name, want := range map[string]float64{
		"prefixmesh_simengine_cached_tokens_total":  4 * 4096,
		"prefixmesh_simengine_prompt_tokens_total":  5 * 4100,
		"prefixmesh_simengine_prefill_tokens_total": 4100 + 4*4,
		"prefixmesh_simengine_output_tokens_total":  5 * 4,
	} {
		if got := counterValue(t, te, name, nil); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if got := counterValue(t, te, "prefixmesh_simengine_requests_total", map[string]string{"endpoint": "completions", "code": "200"}); got != 5 {
		t.Errorf("requests_total{completions,200} = %v, want 5", got)
	}
	te.checkDrained(t)
}

// Completions and chat, JSON and SSE, text and token-id prompts, under cl100k_base.
func TestGenerationWellFormed(t *testing.T) {
	cfg := fastConfig()
	cfg.Tokenizer = tokenizer.CL100kBase
	te := startEngine(t, cfg)
	tok, _ := tokenizer.New(tokenizer.CL100kBase)
	msgs := []tokenizer.ChatMessage{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "What is a prefix cache?"}}
	cases := []struct {
		name, path string
		body       map[string]any
		prompt     []uint32
	}{
		{"completion-text", "/v1/completions", map[string]any{"model": "prefixmesh-sim", "prompt": "hello world, this is a prompt"}, tok.Encode("hello world, this is a prompt")},
		{"completion-ids", "/v1/completions", map[string]any{"prompt": []int{15339, 1917, 7, 8, 9}}, []uint32{15339, 1917, 7, 8, 9}},
		{"completion-batch-of-one", "/v1/completions", map[string]any{"prompt": []string{"hi there"}}, tok.Encode("hi there")},
		{"chat", "/v1/chat/completions", map[string]any{"messages": msgs}, tok.Encode(tokenizer.RenderChat(msgs))},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			chat := strings.Contains(c.path, "chat")
			c.body["max_tokens"] = 7
			c.body["stream"] = false
			resp, b := te.post(t, c.path, c.body)
			if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("status %d: %s", resp.StatusCode, b)
			}
			r := decodeResponse(t, b)
			wantObject := map[bool]string{false: "text_completion", true: "chat.completion"}[chat]
			if r.Object != wantObject || r.ID == "" || r.Model != "prefixmesh-sim" || len(r.Choices) != 1 {
				t.Fatalf("malformed response %s", b)
			}
			ch := r.Choices[0]
			var text string
			if chat {
				if ch.Message == nil || ch.Message.Role != "assistant" {
					t.Fatalf("chat choice without an assistant message: %s", b)
				}
				text = ch.Message.Content
			} else {
				if ch.Text == nil {
					t.Fatalf("completion choice without text: %s", b)
				}
				text = *ch.Text
			}
			if ch.FinishReason == nil || *ch.FinishReason != "length" || text == "" {
				t.Fatalf("choice %s", b)
			}
			u := r.Usage
			if u.PromptTokens != len(c.prompt) || u.CompletionTokens != 7 || u.TotalTokens != len(c.prompt)+7 {
				t.Fatalf("usage %+v, want prompt %d, completion 7", u, len(c.prompt))
			}
			if n := len(tok.Encode(text)); n != 7 {
				t.Errorf("output %q is %d tokens, want 7", text, n)
			}
			c.body["stream"] = true
			s := te.streamAll(t, c.path, c.body)
			if s.text != text {
				t.Fatalf("streamed text %q differs from the JSON text %q (output must be deterministic)", s.text, text)
			}
			wantChunkObject := map[bool]string{false: "text_completion", true: "chat.completion.chunk"}[chat]
			contentChunks := 0
			for _, ch := range s.chunks {
				if ch.Object != wantChunkObject || ch.ID != s.chunks[0].ID || len(ch.Choices) != 1 || ch.Usage != nil {
					t.Fatalf("malformed chunk %+v", ch)
				}
				if c := ch.Choices[0]; (c.Text != nil && *c.Text != "") || (c.Delta != nil && c.Delta.Content != "") {
					contentChunks++
				}
			}
			if contentChunks != 7 {
				t.Fatalf("%d content chunks, want one per token (7)", contentChunks)
			}
			last := s.chunks[len(s.chunks)-1].Choices[0]
			if last.FinishReason == nil || *last.FinishReason != "length" {
				t.Fatalf("last chunk has no finish_reason: %+v", last)
			}
			if chat && (s.chunks[0].Choices[0].Delta == nil || s.chunks[0].Choices[0].Delta.Role != "assistant") {
				t.Fatalf("first chat chunk does not carry the role")
			}
		})
	}
	te.checkDrained(t)
}

// With one slot and no queue, a request arriving while a slow one streams gets 429; when the slow
// client disconnects its blocks come back and the next request is served.
func TestQueueFullThenDisconnectReleases(t *testing.T) {
	cfg := fastConfig()
	cfg.MaxConcurrent, cfg.MaxQueue = 1, 0
	cfg.DecodeTokensPerSec = 10 // 1,000 tokens take 100 s: the request stays in flight
	te := startEngine(t, cfg)
	ctx, cancel := context.WithCancel(t.Context())
	slow := te.openStream(t, ctx, "/v1/completions", map[string]any{"prompt": tokenPrompt(100, 1), "max_tokens": 1000, "stream": true})
	readFirstText(t, slow) // admitted and decoding
	if l := te.Load(); l.Running != 1 || l.FreeBlocks != cfg.KVBlocks-(100+1000+15)/16 {
		t.Fatalf("load while the slow request runs: %+v", l)
	}

	resp, b := te.post(t, "/v1/completions", map[string]any{"prompt": "quick", "max_tokens": 1})
	var e openai.ErrorBody
	if err := json.Unmarshal(b, &e); err != nil || resp.StatusCode != 429 || e.Error.Type != "rate_limit_error" || *e.Error.Code != "queue_full" {
		t.Fatalf("second request: %d %s, want 429 queue_full", resp.StatusCode, b)
	}

	cancel() // the slow client disconnects
	slow.Body.Close()
	eventually(t, "the disconnected request to release its blocks", func() bool { return te.Load().Running == 0 })
	if resp, b := te.post(t, "/v1/completions", map[string]any{"prompt": "quick", "max_tokens": 1}); resp.StatusCode != 200 {
		t.Fatalf("after the disconnect: %d %s", resp.StatusCode, b)
	}
	te.checkDrained(t)
	if got := counterValue(t, te, "prefixmesh_simengine_requests_total", map[string]string{"endpoint": "completions", "code": "429"}); got != 1 {
		t.Fatalf("requests_total{code=429} = %v, want 1", got)
	}
}

// readFirstText reads SSE events until one carries text, leaving the rest of the stream unread.
func readFirstText(t *testing.T, resp *http.Response) {
	t.Helper()
	r := bufio.NewReader(resp.Body)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("stream ended before the first token: %v", err)
		}
		var c response
		if p, ok := strings.CutPrefix(strings.TrimSpace(line), "data: "); ok && json.Unmarshal([]byte(p), &c) == nil &&
			len(c.Choices) == 1 && c.Choices[0].Text != nil && *c.Choices[0].Text != "" {
			return
		}
	}
}

// A queued request is visible in Load and starts when the running one leaves.
func TestQueuedRequestWaitsForSlot(t *testing.T) {
	cfg := fastConfig()
	cfg.MaxConcurrent, cfg.MaxQueue = 1, 4
	cfg.DecodeTokensPerSec = 10
	te := startEngine(t, cfg)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	slow := te.openStream(t, ctx, "/v1/completions", map[string]any{"prompt": tokenPrompt(64, 1), "max_tokens": 1000, "stream": true})
	readFirstText(t, slow)

	done := make(chan *http.Response, 1)
	go func() {
		resp, err := http.Post(te.srv.URL+"/v1/completions", "application/json",
			strings.NewReader(`{"prompt": "`+strings.Repeat("q", 40)+`", "max_tokens": 2}`))
		if err != nil {
			t.Error(err)
		}
		done <- resp
	}()
	eventually(t, "the second request to queue", func() bool { return te.Load().Waiting == 1 })
	if l := te.Load(); l.QueuedPrefillTokens != 40 || l.Running != 1 {
		t.Fatalf("load with one queued 40-token prompt: %+v", l)
	}
	cancel()
	slow.Body.Close()
	resp := <-done
	if resp == nil || resp.StatusCode != 200 {
		t.Fatalf("queued request: %v", resp)
	}
	resp.Body.Close()
	te.checkDrained(t)
}

// A pool of 32 blocks (512 tokens) under 24 concurrent 150-token requests: they wait for blocks,
// evict each other's cached prefixes, all succeed, and nothing leaks.
func TestPoolPressure(t *testing.T) {
	cfg := fastConfig()
	cfg.KVBlocks = 32
	cfg.MaxConcurrent, cfg.MaxQueue = 4, 64
	cfg.PrefillTokensPerSec = 2e6 // a few hundred µs per prefill, enough to overlap requests
	cfg.DecodeTokensPerSec = 1e5
	te := startEngine(t, cfg)
	var wg sync.WaitGroup
	codes := make([]int, 24)
	for i := range codes {
		wg.Go(func() {
			// Pairs of requests share a 96-token prefix; the rest of each prompt is its own.
			prompt := append(tokenPrompt(96, uint32(1000*(i/2))), tokenPrompt(54, uint32(500000+100*i))...)
			resp, err := http.Post(te.srv.URL+"/v1/completions", "application/json",
				strings.NewReader(string(toJSON(t, map[string]any{"prompt": prompt, "max_tokens": 8}))))
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			codes[i] = resp.StatusCode
		})
	}
	wg.Wait()
	for i, c := range codes {
		if c != 200 {
			t.Fatalf("request %d: status %d", i, c)
		}
	}
	st := te.PoolStats()
	t.Logf("pool: %+v", st)
	if st.Evicted == 0 {
		t.Fatal("no eviction under pressure")
	}
	te.checkDrained(t)
}

// Adapters are separate cache namespaces, selected by "model:id" or adapter_id.
func TestAdapters(t *testing.T) {
	te := startEngine(t, fastConfig())
	prompt := tokenPrompt(64, 7)
	cachedOf := func(body map[string]any) int {
		body["prompt"], body["max_tokens"] = prompt, 1
		resp, b := te.post(t, "/v1/completions", body)
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		return decodeResponse(t, b).Usage.PromptTokensDetails.CachedTokens
	}
	if c := cachedOf(map[string]any{"model": "prefixmesh-sim:42"}); c != 0 {
		t.Fatalf("first adapter request cached %d", c)
	}
	// All 64 tokens are cached; by vLLM's rule the last block is recomputed: 48.
	if c := cachedOf(map[string]any{"adapter_id": 42}); c != 48 {
		t.Fatalf("adapter_id 42 after model :42 cached %d, want 48", c)
	}
	if c := cachedOf(map[string]any{}); c != 0 {
		t.Fatalf("base model reused the adapter's cache: %d", c)
	}
	if got := te.cache.PeekMatchedTokens(prompt, 16, 42); got != 64 {
		t.Fatalf("peek under adapter 42 = %d", got)
	}
	te.checkDrained(t)
}

// A non-streaming client that disconnects mid-decode releases its blocks.
func TestNonStreamingDisconnectReleases(t *testing.T) {
	cfg := fastConfig()
	cfg.DecodeTokensPerSec = 10
	te := startEngine(t, cfg)
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, "POST", te.srv.URL+"/v1/completions",
			strings.NewReader(`{"prompt": [1,2,3,4,5], "max_tokens": 500}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	eventually(t, "the request to run", func() bool { return te.Load().Running == 1 })
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("the cancelled request completed")
	}
	te.checkDrained(t)
}

// Blocks pinned in the cache by someone else (the node agent applies Raft prefix pins with
// PinPrefix) are not evictable; a request that cannot fit beside them while nothing runs gets 503
// instead of waiting forever, and fits once the pin is released.
func TestPinnedPrefixExhaustsPool(t *testing.T) {
	cfg := fastConfig()
	cfg.KVBlocks = 8
	te := startEngine(t, cfg)
	pinned := tokenPrompt(96, 1) // 6 blocks
	if resp, b := te.post(t, "/v1/completions", map[string]any{"prompt": pinned, "max_tokens": 1}); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if got := te.cache.PinPrefix(pinned, cfg.BlockSize, 0); got != 96 {
		t.Fatalf("pinned %d tokens", got)
	}
	other := map[string]any{"prompt": tokenPrompt(40, 5000), "max_tokens": 8} // 3 blocks, 2 free
	resp, b := te.post(t, "/v1/completions", other)
	var e openai.ErrorBody
	if err := json.Unmarshal(b, &e); err != nil || resp.StatusCode != 503 || *e.Error.Code != "kv_pool_exhausted" {
		t.Fatalf("%d %s, want 503 kv_pool_exhausted", resp.StatusCode, b)
	}
	te.cache.ReleaseMatched(pinned, cfg.BlockSize, 96, 0)
	if resp, b := te.post(t, "/v1/completions", other); resp.StatusCode != 200 {
		t.Fatalf("after unpinning: %d %s", resp.StatusCode, b)
	}
	te.checkDrained(t)
}

// A second chat turn extends the first turn's rendering, so it reuses the first turn's full
// blocks up to where the token sequences diverge (cl100k_base, the real template).
func TestMultiTurnChatReusesPrefix(t *testing.T) {
	cfg := fastConfig()
	cfg.Tokenizer = tokenizer.CL100kBase
	te := startEngine(t, cfg)
	tok, _ := tokenizer.New(tokenizer.CL100kBase)
	turn1 := []tokenizer.ChatMessage{
		{Role: "system", Content: strings.Repeat("You are a careful assistant who answers in full sentences. ", 20)},
		{Role: "user", Content: "Explain prefix caching."},
	}
	turn2 := append(append([]tokenizer.ChatMessage{}, turn1...),
		tokenizer.ChatMessage{Role: "assistant", Content: "It reuses KV blocks."},
		tokenizer.ChatMessage{Role: "user", Content: "And routing?"})
	t1, t2 := tok.Encode(tokenizer.RenderChat(turn1)), tok.Encode(tokenizer.RenderChat(turn2))
	common := 0
	for common < len(t1) && common < len(t2) && t1[common] == t2[common] {
		common++
	}
	want := common / cfg.BlockSize * cfg.BlockSize
	if want == 0 {
		t.Fatal("the turns share no full block; the test prompt is too short")
	}
	for i, c := range []struct {
		msgs []tokenizer.ChatMessage
		want int
	}{{turn1, 0}, {turn2, want}} {
		resp, b := te.post(t, "/v1/chat/completions", map[string]any{"messages": c.msgs, "max_tokens": 3})
		if resp.StatusCode != 200 {
			t.Fatalf("turn %d: %d %s", i+1, resp.StatusCode, b)
		}
		if got := decodeResponse(t, b).Usage.PromptTokensDetails.CachedTokens; got != c.want {
			t.Fatalf("turn %d cached %d tokens, want %d (common prefix %d of %d)", i+1, got, c.want, common, len(t2))
		}
	}
	te.checkDrained(t)
}
