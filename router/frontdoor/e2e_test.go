package frontdoor

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/prefixmesh/prefixmesh/internal/tokenizer"
	"github.com/prefixmesh/prefixmesh/router/requests"
)

// systemPrompt is a long, deterministic system prompt: conversations that share it share a
// multi-block prefix.
func systemPrompt(i int) string {
	rng := rand.New(rand.NewPCG(uint64(i), 7))
	words := []string{"cache", "router", "prefix", "token", "block", "node", "fleet", "model", "engine", "latency",
		"queue", "prefill", "decode", "summary", "gossip", "index"}
	var sb strings.Builder
	fmt.Fprintf(&sb, "You are assistant %d. ", i)
	for range 220 {
		sb.WriteString(words[rng.IntN(len(words))])
		sb.WriteByte(' ')
	}
	return sb.String()
}

// conversation is one client's multi-turn chat.
type conversation struct {
	id      int
	session string // "" = no session header
	kind    string // "chat", "text" (completions with a text prompt) or "ids" (token ids)
	msgs    []tokenizer.ChatMessage
}

// request builds the next turn's body: chat messages, or the same conversation rendered as a
// completions prompt (text or token ids).
func (c *conversation) request(tok tokenizer.Tokenizer, turn int, stream bool) (string, map[string]any, http.Header) {
	c.msgs = append(c.msgs, tokenizer.ChatMessage{Role: "user", Content: fmt.Sprintf("Question %d of conversation %d: how do prefixes travel?", turn, c.id)})
	h := http.Header{}
	if c.session != "" {
		h.Set(requests.HeaderSessionID, c.session)
	}
	var path string
	var body map[string]any
	switch c.kind {
	case "chat":
		path, body = "/v1/chat/completions", chatBody(c.msgs, stream, 6)
	default:
		text := tokenizer.RenderChat(c.msgs)
		var prompt any = text
		if c.kind == "ids" {
			prompt = tok.Encode(text)
		}
		path, body = "/v1/completions", map[string]any{"model": simModel, "prompt": prompt, "max_tokens": 6}
		if stream {
			body["stream"] = true
		}
	}
	return path, body, h
}

func newConversations(n int) []*conversation {
	var convs []*conversation
	for i := range n {
		c := &conversation{id: i, kind: []string{"chat", "text", "ids"}[i%3]}
		if i%2 == 0 {
			c.session = fmt.Sprintf("session-%d", i)
		}
		c.msgs = []tokenizer.ChatMessage{{Role: "system", Content: systemPrompt(i % 3)}}
		convs = append(convs, c)
	}
	return convs
}

// checkResult verifies a response is complete and equals the oracle engine's answer.
func checkResult(t *testing.T, what string, got, want *result, stream bool) {
	t.Helper()
	if got.status != http.StatusOK {
		t.Fatalf("%s: status %d, error %+v", what, got.status, got.errBody)
	}
	if stream && !got.done {
		t.Fatalf("%s: stream without [DONE]", what)
	}
	if got.text == "" || got.text != want.text || got.finish != "length" {
		t.Fatalf("%s: text %q (finish %q), want %q", what, got.text, got.finish, want.text)
	}
	if got.cached < 0 || got.estimate < 0 || got.header.Get(HeaderNode) == "" {
		t.Fatalf("%s: missing headers %v", what, got.header)
	}
	if got.usage != nil && got.usage.PromptTokensDetails.CachedTokens != got.cached {
		t.Fatalf("%s: usage cached_tokens %d, header %d", what, got.usage.PromptTokensDetails.CachedTokens, got.cached)
	}
}

// The whole path on loopback: 4 simulated engines, the index fed from their journals between
// requests, multi-turn conversations sharing system prompts over chat and completions (text and
// token ids), streaming and not. Every answer equals the one a lone engine gives; with one request
// at a time the estimate equals the engine's cached_tokens; a node killed mid-run costs no client
// a visible error.
func TestEndToEndSequential(t *testing.T) {
	f := startFleet(t, fleetOpts{})
	oracle := startSimNode(t, "oracle", fastEngineConfig())
	tok, err := tokenizer.New(tokenizer.CL100kBase)
	if err != nil {
		t.Fatal(err)
	}
	convs := newConversations(12)
	const turns = 6
	client := &http.Client{}
	total, exact, hits, killedAt, cachedSum := 0, 0, 0, -1, 0
	perNode := map[string]int{}
	last, killed := "", "" // the node that served the last request; the one killed
	sessionNode := map[int]string{}
	for turn := range turns {
		if turn == turns/2 {
			// Kill the node that served last, which the conversations' shared system prompts
			// draw the next requests to: the view still lists it, so the front door must find
			// out and retry.
			var i int
			if _, err := fmt.Sscanf(last, "node-%d", &i); err != nil {
				t.Fatalf("last node %q: %v", last, err)
			}
			f.killNode(i)
			killed, killedAt = last, total
		}
		for _, c := range convs {
			stream := (turn+c.id)%2 == 0
			path, body, h := c.request(tok, turn, stream)
			f.syncIndex(t)
			what := fmt.Sprintf("turn %d conversation %d (%s, stream %v)", turn, c.id, c.kind, stream)
			got, err := do(t.Context(), client, f.srv.URL, path, body, h)
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			want, err := do(t.Context(), client, oracle.srv.URL, path, body, nil)
			if err != nil {
				t.Fatalf("%s: oracle: %v", what, err)
			}
			checkResult(t, what, got, want, stream)
			total++
			if got.estimate == got.cached {
				exact++
			} else {
				t.Logf("%s: estimate %d, cached %d on %s", what, got.estimate, got.cached, got.header.Get(HeaderNode))
			}
			if got.cached > 0 {
				hits++
			}
			if got.cached >= 0 {
				cachedSum += got.cached
			}
			last = got.header.Get(HeaderNode)
			if last == killed && total > killedAt && killedAt >= 0 {
				t.Fatalf("%s: served by the killed node", what)
			}
			perNode[got.header.Get(HeaderNode)]++
			if c.session != "" && killedAt < 0 { // affinity: a session stays on its node
				if prev, ok := sessionNode[c.id]; ok && prev != got.header.Get(HeaderNode) {
					t.Fatalf("%s: session moved from %s to %s", what, prev, got.header.Get(HeaderNode))
				}
				sessionNode[c.id] = got.header.Get(HeaderNode)
			}
			c.msgs = append(c.msgs, tokenizer.ChatMessage{Role: "assistant", Content: got.text})
		}
	}
	share := float64(exact) / float64(total)
	t.Logf("sequential: %d requests, estimate == cached_tokens for %d (%.1f%%), %d cache hits, per node %v, retries %v, ejections %v",
		total, exact, 100*share, hits, perNode, counterValue(t, f.reg, "prefixmesh_frontdoor_retries_total"),
		counterValue(t, f.reg, "prefixmesh_frontdoor_ejections_total"))
	if share < 0.99 {
		t.Fatalf("estimate equalled cached_tokens for %.1f%% of requests, want >= 99%%", 100*share)
	}
	if hits < total/2 {
		t.Fatalf("only %d of %d requests hit the cache: routing does not follow prefixes", hits, total)
	}
	if counterValue(t, f.reg, "prefixmesh_frontdoor_retries_total") == 0 {
		t.Fatal("no request was retried after the kill: the test did not exercise the failure")
	}
	if got, want := counterValue(t, f.reg, "prefixmesh_frontdoor_estimate_exact_total"), float64(exact); got != want {
		t.Fatalf("estimate_exact_total %v, want %v", got, want)
	}
	// The engine-observed hit ratio's numerator is the sum of what the engines reported.
	if got, want := counterValue(t, f.reg, "prefixmesh_frontdoor_engine_cached_tokens_total"), float64(cachedSum); got != want {
		t.Fatalf("engine_cached_tokens_total %v, want %v (the responses' cached_tokens)", got, want)
	}
	for _, field := range []string{`"node":"node-`, `"policy":"prefixmesh"`, `"estimate":`, `"cached_tokens":`, `"ttft":`, `"status":200`, `"retries":1`} {
		if !strings.Contains(f.logs.String(), field) {
			t.Fatalf("no request log line with %s", field)
		}
	}
	resp, err := http.Get(f.srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, series := range []string{`prefixmesh_frontdoor_decisions_total{node="node-`,
		"prefixmesh_frontdoor_estimate_abs_error_tokens_bucket", "prefixmesh_frontdoor_ttft_seconds_bucket",
		"prefixmesh_frontdoor_inflight_requests 0"} { // ejection itself: health_test.go
		if !strings.Contains(string(b), series) {
			t.Fatalf("/metrics lacks %s", series)
		}
	}
}

// The same workload with 8 clients at once and the index synced before every request: all
// answers are correct; the estimate's accuracy is reported (in-flight requests have not
// inserted yet, so it is below the sequential figure by design).
func TestEndToEndConcurrent(t *testing.T) {
	f := startFleet(t, fleetOpts{})
	tok, err := tokenizer.New(tokenizer.CL100kBase)
	if err != nil {
		t.Fatal(err)
	}
	convs := newConversations(24)
	const workers, turns = 8, 4
	var mu sync.Mutex // guards total, exact, over
	total, exact, over := 0, 0, 0
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := &http.Client{}
			for turn := range turns {
				for _, c := range convs[w*len(convs)/workers : (w+1)*len(convs)/workers] {
					stream := (turn+c.id)%2 == 0
					path, body, h := c.request(tok, turn, stream)
					f.syncIndex(t)
					got, err := do(context.Background(), client, f.srv.URL, path, body, h)
					if err == nil && (got.status != http.StatusOK || got.text == "" || (stream && !got.done)) {
						err = fmt.Errorf("status %d text %q done %v", got.status, got.text, got.done)
					}
					if err != nil {
						errs <- fmt.Errorf("worker %d turn %d conversation %d: %w", w, turn, c.id, err)
						return
					}
					mu.Lock()
					total++
					switch {
					case got.estimate == got.cached:
						exact++
					case got.estimate > got.cached:
						over++
					}
					mu.Unlock()
					c.msgs = append(c.msgs, tokenizer.ChatMessage{Role: "assistant", Content: got.text})
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("concurrent (%d clients): %d requests, estimate == cached_tokens for %d (%.1f%%); of the misses %d "+
		"over-estimated (a prefix in flight, in the overlay, not yet inserted) and %d under-estimated",
		workers, total, exact, 100*float64(exact)/float64(total), over, total-exact-over)
	eventually(t, "in-flight counts to return to 0", func() bool {
		for _, n := range f.nodes {
			if f.picker.InFlight(n.id) != 0 {
				return false
			}
		}
		return f.fd.InFlight() == 0
	})
}

// A node killed while 8 clients are busy: every request that had not started streaming when it
// died is retried elsewhere and succeeds; only streams already under way may end with an error.
func TestKillNodeUnderLoad(t *testing.T) {
	eng := fastEngineConfig()
	eng.DecodeTokensPerSec = 2000 // 20 tokens: ~10 ms per request, so requests are in flight at the kill
	f := startFleet(t, fleetOpts{engine: eng})
	tok, err := tokenizer.New(tokenizer.CL100kBase)
	if err != nil {
		t.Fatal(err)
	}
	convs := newConversations(16)
	const workers, turns = 8, 6
	var mu sync.Mutex // guards done, streamsCut
	done, streamsCut := 0, 0
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := &http.Client{}
			for turn := range turns {
				for _, c := range convs[w*len(convs)/workers : (w+1)*len(convs)/workers] {
					stream := (turn+c.id)%2 == 0
					path, body, h := c.request(tok, turn, stream)
					body["max_tokens"] = 20
					f.syncIndex(t)
					got, err := do(context.Background(), client, f.srv.URL, path, body, h)
					if err == nil && got.status != http.StatusOK {
						err = fmt.Errorf("status %d: %+v", got.status, got.errBody)
					}
					mu.Lock()
					done++
					if err != nil && stream && got != nil && got.status == http.StatusOK {
						streamsCut++ // the stream had begun: passing the error on is the contract
						err = nil
					}
					mu.Unlock()
					if err != nil {
						errs <- fmt.Errorf("worker %d turn %d conversation %d (stream %v): %w", w, turn, c.id, stream, err)
						return
					}
					c.msgs = append(c.msgs, tokenizer.ChatMessage{Role: "assistant", Content: got.text})
				}
			}
		}()
	}
	eventually(t, "a third of the workload", func() bool { mu.Lock(); defer mu.Unlock(); return done >= len(convs)*turns/3 })
	f.killNode(0)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("kill under load: %d requests, %d streams cut after they began, retries %v, ejections %v", done, streamsCut,
		counterValue(t, f.reg, "prefixmesh_frontdoor_retries_total"), counterValue(t, f.reg, "prefixmesh_frontdoor_ejections_total"))
}
