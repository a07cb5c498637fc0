package frontdoor

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

func get(t *testing.T, url string) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

func postJSON(t *testing.T, url, body string) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

// vLLM's side endpoints: /v1/models/{id}, /health, /version, /tokenize and /detokenize.
func TestVLLMEndpoints(t *testing.T) {
	f := startFleet(t, fleetOpts{nodes: 2})
	if resp, b := get(t, f.srv.URL+"/v1/models/"+simModel); resp.StatusCode != 200 || !strings.Contains(string(b), `"id":"`+simModel+`"`) {
		t.Fatalf("model: %d %s", resp.StatusCode, b)
	}
	resp, b := get(t, f.srv.URL+"/v1/models/gpt-9")
	var e apiError
	if json.Unmarshal(b, &e) != nil || resp.StatusCode != 404 || e.Error.Code != codeModelNotFound || e.Error.Param == nil || *e.Error.Param != "model" {
		t.Fatalf("unknown model: %d %s", resp.StatusCode, b)
	}
	if resp, b := get(t, f.srv.URL+"/health"); resp.StatusCode != 200 || len(b) != 0 {
		t.Fatalf("health: %d %q", resp.StatusCode, b)
	}
	if resp, b := get(t, f.srv.URL+"/version"); resp.StatusCode != 200 || !strings.Contains(string(b), `"version"`) {
		t.Fatalf("version: %d %s", resp.StatusCode, b)
	}
	resp, b = postJSON(t, f.srv.URL+"/tokenize", `{"model":"`+simModel+`","prompt":"hello world"}`)
	var tk struct {
		Tokens []uint32 `json:"tokens"`
		Count  int      `json:"count"`
	}
	if resp.StatusCode != 200 || json.Unmarshal(b, &tk) != nil || tk.Count == 0 || len(tk.Tokens) != tk.Count {
		t.Fatalf("tokenize: %d %s", resp.StatusCode, b)
	}
	// A model no node serves: 404 model_not_found, as /v1/completions answers it.
	for _, path := range []string{"/tokenize", "/detokenize"} {
		resp, b = postJSON(t, f.srv.URL+path, `{"model":"gpt-9","prompt":"hello","tokens":[1]}`)
		if json.Unmarshal(b, &e) != nil || resp.StatusCode != 404 || e.Error.Code != codeModelNotFound || e.Error.Param == nil || *e.Error.Param != "model" {
			t.Fatalf("%s, unknown model: %d %s", path, resp.StatusCode, b)
		}
	}
	resp, b = postJSON(t, f.srv.URL+"/v1/completions", `{"model":"gpt-9","prompt":"hello","max_tokens":1}`)
	if json.Unmarshal(b, &e) != nil || resp.StatusCode != 404 || e.Error.Code != codeModelNotFound {
		t.Fatalf("completions, unknown model: %d %s", resp.StatusCode, b)
	}
	ids, _ := json.Marshal(tk.Tokens)
	resp, b = postJSON(t, f.srv.URL+"/detokenize", `{"model":"`+simModel+`","tokens":`+string(ids)+`}`)
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"prompt":"hello world"`) {
		t.Fatalf("detokenize: %d %s", resp.StatusCode, b)
	}
	resp, b = postJSON(t, f.srv.URL+"/detokenize", `{"tokens":[1,null]}`)
	if json.Unmarshal(b, &e) != nil || resp.StatusCode != 400 || e.Error.Param == nil || *e.Error.Param != "tokens" {
		t.Fatalf("detokenize null id: %d %s", resp.StatusCode, b)
	}
}

// Paths ServeMux would redirect get a JSON 404 naming the path to use, never a bare 301.
func TestNoBareRedirects(t *testing.T) {
	f := startFleet(t, fleetOpts{nodes: 1})
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, p := range []string{"//v1/models", "/v1/./models", "/v1/completions/", "/v1/x/../completions"} {
		req, _ := http.NewRequest(http.MethodPost, f.srv.URL+p, strings.NewReader(`{"prompt":"x"}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		checkError(t, p, resp, http.StatusNotFound, codeNotFound, "did you mean")
	}
}

func TestCORS(t *testing.T) {
	f := startFleet(t, fleetOpts{nodes: 1, cfg: func(c *Config) { c.CORSOrigins = []string{"https://app.example"} }})
	req, _ := http.NewRequest(http.MethodOptions, f.srv.URL+"/v1/chat/completions", nil)
	req.Header.Set("Origin", "https://app.example")
	req.Header.Set("Access-Control-Request-Method", "POST")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 204 || resp.Header.Get("Access-Control-Allow-Origin") != "https://app.example" ||
		!strings.Contains(resp.Header.Get("Access-Control-Allow-Headers"), "Authorization") {
		t.Fatalf("preflight: %d %v", resp.StatusCode, resp.Header)
	}
	req, _ = http.NewRequest(http.MethodGet, f.srv.URL+"/v1/models", nil)
	req.Header.Set("Origin", "https://evil.example")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("CORS header for an origin not allowed: %v", resp.Header)
	}
}

// A batch of prompts is split, each routed on its own, and merged as vLLM answers a batch.
func TestBatchSplitAndMerged(t *testing.T) {
	f := startFleet(t, fleetOpts{nodes: 2})
	for _, prompt := range []string{`["alpha beta","gamma delta","epsilon"]`, `[[1,2,3],[4,5,6,7],[8]]`} {
		resp, b := postJSON(t, f.srv.URL+"/v1/completions", `{"model":"`+simModel+`","prompt":`+prompt+`,"max_tokens":3}`)
		var c struct {
			Choices []struct {
				Index int    `json:"index"`
				Text  string `json:"text"`
			} `json:"choices"`
			Usage struct {
				PromptTokens     int `json:"prompt_tokens"`
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if resp.StatusCode != 200 || json.Unmarshal(b, &c) != nil || len(c.Choices) != 3 || c.Usage.CompletionTokens != 9 {
			t.Fatalf("%s: %d %s", prompt, resp.StatusCode, b)
		}
		for i, ch := range c.Choices {
			if ch.Index != i || ch.Text == "" {
				t.Fatalf("%s: choice %d = %+v", prompt, i, ch)
			}
		}
		if strings.HasPrefix(prompt, "[[") && c.Usage.PromptTokens != 8 {
			t.Fatalf("usage %+v, want 8 prompt tokens", c.Usage)
		}
	}
	// Streaming: every prompt's chunks, reindexed, one usage chunk, one [DONE].
	r, err := do(t.Context(), http.DefaultClient, f.srv.URL, "/v1/completions",
		`{"prompt":[[1,2],[3,4]],"max_tokens":2,"stream":true,"stream_options":{"include_usage":true}}`, nil)
	if err != nil || r.status != 200 || !r.done || r.usage == nil || r.usage.CompletionTokens != 4 || r.usage.PromptTokens != 4 {
		t.Fatalf("stream batch: %+v %v", r, err)
	}
	// A prompt the engine refuses fails the whole (non-streaming) batch with its error.
	resp, b := postJSON(t, f.srv.URL+"/v1/completions", `{"prompt":["ok","ok"],"max_tokens":3,"n":2}`)
	if resp.StatusCode != 400 || !strings.Contains(string(b), "n 2") {
		t.Fatalf("refused prompt: %d %s", resp.StatusCode, b)
	}
}
