package routerd

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/prefixmesh/prefixmesh/internal/tokenizer"
	"github.com/prefixmesh/prefixmesh/local"
	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
	"github.com/prefixmesh/prefixmesh/tokenizer/tokenizertest"
)

// TestRealTokenizersEndToEnd runs the router and three simulated engines on a real model's
// tokenizer (hf:DIR: Llama-3.1, then Qwen3), sends multi-turn chats (with tools, tool calls,
// content parts, no-think) and growing text prompts through the front door one at a time, and
// checks that for every request the router's estimate equals the cached_tokens the engine
// reports: both sides computed the same ids from the same request.
func TestRealTokenizersEndToEnd(t *testing.T) {
	for _, model := range []string{"llama3_1", "qwen3"} {
		t.Run(model, func(t *testing.T) {
			spec := tokenizer.HFPrefix + tokenizertest.Dir(t, model)
			tok, err := tokenizer.New(spec)
			if err != nil {
				t.Fatal(err)
			}
			var specs []nodeSpec
			for i := 0; i < 3; i++ {
				specs = append(specs, nodeSpec{id: fmt.Sprint("node-", i), kvBlocks: 4096, tokenizer: spec})
			}
			c := startCluster(t, specs, "--tokenizer="+spec)
			base := c.router["http"]
			route := pb.NewRouterClient(c.cc)

			exact, hits, n := 0, 0, 0
			send := func(path string, body map[string]any) {
				t.Helper()
				raw, _ := json.Marshal(body)
				var ids []uint32
				if path == "/v1/chat/completions" {
					ids, err = tokenizer.EncodeChat(context.Background(), tok, raw, nil)
				} else {
					ids, err = tokenizer.EncodePrompt(context.Background(), tok, body["prompt"].(string))
				}
				if err != nil {
					t.Fatal(err)
				}
				r := postPath(t, base, path, raw)
				n++
				est, err := strconv.Atoi(r.estimate)
				if err != nil {
					t.Fatalf("%s: estimate header %q", path, r.estimate)
				}
				if est == r.cached {
					exact++
				} else {
					t.Errorf("request %d (%s, %d tokens): estimate %d, cached_tokens %d", n, path, len(ids), est, r.cached)
				}
				if r.cached > 0 {
					hits++
				}
				// One at a time: the next request is sent once the router's view holds this one.
				full := local.EngineCachedTokens(len(ids), len(ids), 16) // all of it held, by vLLM's rule
				c.eventually("the router sees the request's blocks", func() error {
					rr, err := route.Route(context.Background(), &pb.RouteRequest{Tokens: ids, DryRun: true})
					if err != nil {
						return err
					}
					if int(rr.GetEstimatedMatchedTokens()) < full {
						return fmt.Errorf("estimate %d < %d", rr.GetEstimatedMatchedTokens(), full)
					}
					return nil
				})
			}

			system := map[string]any{"role": "system", "content": "You are a careful assistant for operators of LLM fleets. Answer in two sentences, cite the component you mean, and never invent flags."}
			turn := []any{system, map[string]any{"role": "user", "content": "What does a prefix cache store?"}}
			replies := []string{"It stores the KV blocks of prompts already computed, keyed by the hash of their tokens.", "The router keeps a summary of each node's blocks.", "Yes: turn two reuses turn one's blocks."}
			questions := []string{"How does the router know where blocks are?", "Does a second turn hit?", "Thanks!"}
			for i := range replies {
				send("/v1/chat/completions", map[string]any{"model": "prefixmesh-sim", "messages": turn, "max_tokens": 2})
				turn = append(turn, map[string]any{"role": "assistant", "content": replies[i]}, map[string]any{"role": "user", "content": questions[i]})
			}
			tools := []any{map[string]any{"type": "function", "function": map[string]any{"name": "get_load", "description": "Load of a node",
				"parameters": map[string]any{"type": "object", "properties": map[string]any{"node": map[string]any{"type": "string"}}, "required": []any{"node"}}}}}
			tc := []any{system, map[string]any{"role": "user", "content": [](map[string]any){{"type": "text", "text": "Check node-1."}, {"type": "text", "text": "Then node-2."}}}}
			send("/v1/chat/completions", map[string]any{"model": "prefixmesh-sim", "messages": tc, "tools": tools, "max_tokens": 2})
			tc = append(tc, map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{"id": "c1", "type": "function",
				"function": map[string]any{"name": "get_load", "arguments": `{"node":"node-1"}`}}}},
				map[string]any{"role": "tool", "tool_call_id": "c1", "content": `{"load": 0.25}`})
			send("/v1/chat/completions", map[string]any{"model": "prefixmesh-sim", "messages": tc, "tools": tools, "max_tokens": 2})
			send("/v1/chat/completions", map[string]any{"model": "prefixmesh-sim", "messages": turn[:2], "max_tokens": 2,
				"chat_template_kwargs": map[string]any{"enable_thinking": false}})

			text := strings.Repeat("Prefix caches reuse the KV blocks of shared prompt prefixes across requests. ", 12)
			for i := 0; i < 3; i++ {
				send("/v1/completions", map[string]any{"model": "prefixmesh-sim", "prompt": text, "max_tokens": 2})
				text += fmt.Sprintf("Turn %d adds a sentence about node-%d and its blocks. ", i, i)
			}
			if exact != n || hits < n/2 {
				t.Fatalf("estimate == cached_tokens for %d/%d requests, %d hits", exact, n, hits)
			}
			t.Logf("%s: estimate == cached_tokens for %d/%d requests (%d with cached tokens)", model, exact, n, hits)
		})
	}
}

// postPath posts raw to base+path and reads the estimate and cached_tokens.
func postPath(t *testing.T, base, path string, raw []byte) completion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), clusterWait)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+base+path, bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s %s: %d %s", path, raw, resp.StatusCode, out)
	}
	var u struct {
		Usage struct {
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(out, &u); err != nil {
		t.Fatalf("response %s: %v", out, err)
	}
	return completion{node: resp.Header.Get("X-Prefixmesh-Node"), estimate: resp.Header.Get("X-Prefixmesh-Estimated-Tokens"), cached: u.Usage.Details.Cached, body: string(out)}
}
