package frontdoor

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/prefixmesh/prefixmesh/internal/tokenizer"
)

// The OpenAI wire protocol as the official clients speak it, with nothing but net/http: JSON
// answers for plain requests, and for stream: true a text/event-stream of "data: <json>" events
// ending with "data: [DONE]", the usage in a last chunk when stream_options.include_usage is set.
func TestOpenAIWireProtocol(t *testing.T) {
	f := startFleet(t, fleetOpts{nodes: 2})
	base := f.srv.URL
	post := func(path, body string) *http.Response {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json")
		req.Header.Set("Authorization", "Bearer sk-anything")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d", path, resp.StatusCode)
		}
		return resp
	}

	// GET /v1/models: the union of the nodes' models.
	resp, err := http.Get(base + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var models struct {
		Object string
		Data   []struct{ ID, Object, OwnedBy string }
	}
	if err := json.NewDecoder(resp.Body).Decode(&models); err != nil || models.Object != "list" ||
		len(models.Data) != 1 || models.Data[0].ID != simModel || models.Data[0].Object != "model" {
		t.Fatalf("models: %+v %v", models, err)
	}
	resp.Body.Close()

	// Non-streaming completions and chat.
	var comp struct {
		ID, Object, Model string
		Choices           []struct {
			Index        int
			Text         string
			FinishReason string `json:"finish_reason"`
		}
		Usage usageJSON
	}
	r := post("/v1/completions", `{"model":"prefixmesh-sim","prompt":"Say hello to the router","max_tokens":5}`)
	if ct := r.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("content type %q", ct)
	}
	if err := json.NewDecoder(r.Body).Decode(&comp); err != nil {
		t.Fatal(err)
	}
	if comp.Object != "text_completion" || comp.Model != simModel || len(comp.Choices) != 1 || comp.Choices[0].Text == "" ||
		comp.Choices[0].FinishReason != "length" || comp.Usage.CompletionTokens != 5 || comp.Usage.PromptTokens == 0 {
		t.Fatalf("completion %+v", comp)
	}
	var chat struct {
		Object  string
		Choices []struct {
			Message struct{ Role, Content string }
		}
		Usage usageJSON
	}
	r = post("/v1/chat/completions", `{"model":"prefixmesh-sim","messages":[{"role":"user","content":"Hi"}],"max_tokens":3}`)
	if err := json.NewDecoder(r.Body).Decode(&chat); err != nil {
		t.Fatal(err)
	}
	if chat.Object != "chat.completion" || len(chat.Choices) != 1 || chat.Choices[0].Message.Role != "assistant" ||
		chat.Choices[0].Message.Content == "" || chat.Usage.CompletionTokens != 3 {
		t.Fatalf("chat %+v", chat)
	}

	// Streaming: parse the raw lines the way openai-python's SSEDecoder does.
	for _, c := range []struct{ path, body, object string }{
		{"/v1/completions", `{"model":"prefixmesh-sim","prompt":"Stream to me","max_tokens":4,"stream":true,"stream_options":{"include_usage":true}}`, "text_completion"},
		{"/v1/chat/completions", `{"model":"prefixmesh-sim","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Go"}],"max_tokens":4,"stream":true,"stream_options":{"include_usage":true}}`, "chat.completion.chunk"},
	} {
		r := post(c.path, c.body)
		if ct := r.Header.Get("Content-Type"); ct != "text/event-stream" {
			t.Fatalf("%s: content type %q", c.path, ct)
		}
		sc := bufio.NewScanner(r.Body)
		var events [][]byte
		done := false
		for sc.Scan() {
			line := sc.Bytes()
			if len(line) == 0 {
				continue
			}
			data, ok := bytes.CutPrefix(line, []byte("data: "))
			if !ok {
				t.Fatalf("%s: unexpected line %q", c.path, line)
			}
			if string(data) == "[DONE]" {
				done = true
				break
			}
			events = append(events, bytes.Clone(data))
		}
		if !done || len(events) < 5 {
			t.Fatalf("%s: done %v after %d events", c.path, done, len(events))
		}
		text, role, finish := "", "", ""
		var usage *usageJSON
		for _, e := range events {
			var ch struct {
				Object  string
				Choices []struct {
					Text         *string
					Delta        *struct{ Role, Content string }
					FinishReason *string `json:"finish_reason"`
				}
				Usage *usageJSON
			}
			if err := json.Unmarshal(e, &ch); err != nil {
				t.Fatalf("%s: event %q: %v", c.path, e, err)
			}
			if ch.Object != c.object {
				t.Fatalf("%s: object %q", c.path, ch.Object)
			}
			for _, x := range ch.Choices {
				if x.Text != nil {
					text += *x.Text
				}
				if x.Delta != nil {
					text += x.Delta.Content
					if x.Delta.Role != "" {
						role = x.Delta.Role
					}
				}
				if x.FinishReason != nil {
					finish = *x.FinishReason
				}
			}
			if ch.Usage != nil {
				usage = ch.Usage
			}
		}
		if text == "" || finish != "length" || usage == nil || usage.CompletionTokens != 4 {
			t.Fatalf("%s: text %q finish %q usage %+v", c.path, text, finish, usage)
		}
		if c.object == "chat.completion.chunk" && role != "assistant" {
			t.Fatalf("chat stream: first delta role %q", role)
		}
	}
}

// A stream reaches the client chunk by chunk while the engine is still generating (no
// buffering), and a client that goes away cancels the engine's request.
func TestStreamFlushesAndClientDisconnectCancelsUpstream(t *testing.T) {
	eng := fastEngineConfig()
	eng.DecodeTokensPerSec = 20 // 2,000 tokens would take 100 s
	f := startFleet(t, fleetOpts{nodes: 1, engine: eng})
	n := f.nodes[0]
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	body, _ := json.Marshal(chatBody([]tokenizer.ChatMessage{{Role: "user", Content: "Talk for a long time"}}, true, 2000))
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.srv.URL+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	content := 0
	for content < 2 && sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, "data: ") && strings.Contains(line, `"content":"`) &&
			!strings.Contains(line, `"content":""`) {
			content++
		}
	}
	if content < 2 {
		t.Fatalf("stream ended before two content chunks: %v", sc.Err())
	}
	if l := n.eng.Load(); l.Running != 1 {
		t.Fatalf("engine running %d while the client reads the stream, want 1", l.Running)
	}
	if f.picker.InFlight(n.id) != 1 {
		t.Fatalf("picker in-flight %d, want 1", f.picker.InFlight(n.id))
	}
	cancel()
	eventually(t, "the engine to see the cancellation", func() bool { return n.eng.Load().Running == 0 })
	eventually(t, "the front door to finish the request", func() bool { return f.fd.InFlight() == 0 && f.picker.InFlight(n.id) == 0 })
	if f.tap.failures.Load() != 0 {
		t.Fatal("a client disconnect counted as a node failure")
	}
}
