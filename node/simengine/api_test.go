package simengine

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/prefixmesh/prefixmesh/internal/openai"
	"github.com/prefixmesh/prefixmesh/internal/tokenizer"
	"github.com/prefixmesh/prefixmesh/local"
)

func TestModelsAndTokenize(t *testing.T) {
	te := startEngine(t, fastConfig())
	resp, err := http.Get(te.srv.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var models struct {
		Object string `json:"object"`
		Data   []struct {
			ID, Object string
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&models); err != nil || resp.StatusCode != 200 {
		t.Fatalf("models: %d %v", resp.StatusCode, err)
	}
	resp.Body.Close()
	if models.Object != "list" || len(models.Data) != 1 || models.Data[0].ID != "prefixmesh-sim" || models.Data[0].Object != "model" {
		t.Fatalf("models %+v", models)
	}

	msgs := []tokenizer.ChatMessage{{Role: "user", Content: "Hi"}}
	var chatIDs []uint32
	for _, b := range []byte(tokenizer.RenderChat(msgs)) { // the bytes tokenizer
		chatIDs = append(chatIDs, uint32(b))
	}
	for _, c := range []struct {
		body any
		want []uint32
	}{
		{map[string]any{"prompt": "hey"}, []uint32{'h', 'e', 'y'}},
		{map[string]any{"prompt": ""}, []uint32{}},
		{map[string]any{"messages": msgs}, chatIDs},
	} {
		resp, b := te.post(t, "/tokenize", c.body)
		var got tokenizeResponse
		if err := json.Unmarshal(b, &got); err != nil || resp.StatusCode != 200 {
			t.Fatalf("tokenize %v: %d %s", c.body, resp.StatusCode, b)
		}
		if !reflect.DeepEqual(got.Tokens, c.want) || got.Count != len(c.want) {
			t.Fatalf("tokenize %v = %+v, want %v", c.body, got, c.want)
		}
	}
}

// Every client error answers an OpenAI-shaped JSON error naming the problem.
func TestErrors(t *testing.T) {
	cfg := fastConfig()
	cfg.KVBlocks = 8 // 128 tokens
	cfg.MaxBodyBytes = 1 << 10
	te := startEngine(t, cfg)
	cases := []struct {
		name, method, path string
		body               any
		status             int
		msg                string // a substring of error.message
		contentType        string // "" = application/json
	}{
		{"bad json", "POST", "/v1/completions", `{"prompt": "x"`, 400, "invalid JSON", ""},
		{"not an object", "POST", "/v1/completions", `[1,2]`, 400, "must be a JSON object", ""},
		{"trailing data", "POST", "/v1/completions", `{"prompt":"x"} {}`, 400, "trailing", ""},
		{"no prompt", "POST", "/v1/completions", `{"max_tokens": 3}`, 400, `prompt is required`, ""},
		{"empty prompt", "POST", "/v1/completions", `{"prompt": ""}`, 400, `prompt is empty`, ""},
		{"prompt type", "POST", "/v1/completions", `{"prompt": {"a": 1}}`, 400, `prompt must be`, ""},
		{"negative id", "POST", "/v1/completions", `{"prompt": [1, -2]}`, 400, "prompt[1]", ""},
		{"fractional id", "POST", "/v1/completions", `{"prompt": [1.5]}`, 400, "prompt[0]", ""},
		{"null id", "POST", "/v1/completions", `{"prompt": [1, null]}`, 400, "prompt[1]", ""},
		{"nested too deep", "POST", "/v1/completions", `{"prompt": [[[1]]]}`, 400, "nest at most two levels", ""},
		{"zero max_tokens", "POST", "/v1/completions", `{"prompt": "x", "max_tokens": 0}`, 400, "max_tokens must be at least 1, got 0", ""},
		{"batch", "POST", "/v1/completions", `{"prompt": ["a", "b"]}`, 400, "batch of 2", ""},
		{"max_tokens type", "POST", "/v1/completions", `{"prompt": "x", "max_tokens": "ten"}`, 400, "max_tokens: expected an integer, got string", ""},
		{"negative max_tokens", "POST", "/v1/completions", `{"prompt": "x", "max_tokens": -1}`, 400, "max_tokens", ""},
		{"n", "POST", "/v1/completions", `{"prompt": "x", "n": 2}`, 400, "n 2", ""},
		{"stream_options without stream", "POST", "/v1/completions", `{"prompt": "x", "stream_options": {}}`, 400, "stream_options", ""},
		{"unknown model", "POST", "/v1/completions", `{"model": "gpt-4", "prompt": "x"}`, 404, `"gpt-4" does not exist`, ""},
		{"bad adapter", "POST", "/v1/completions", `{"model": "prefixmesh-sim:lora", "prompt": "x"}`, 400, "decimal id", ""},
		{"adapter conflict", "POST", "/v1/completions", `{"model": "prefixmesh-sim:3", "adapter_id": 4, "prompt": "x"}`, 400, "contradicts", ""},
		{"no messages", "POST", "/v1/chat/completions", `{"messages": []}`, 400, `messages must not be empty`, ""},
		{"bad role", "POST", "/v1/chat/completions", `{"messages": [{"role": "", "content": "x"}]}`, 400, "role", ""},
		{"image part", "POST", "/v1/chat/completions", `{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}`, 400, "text parts", ""},
		{"too large for the pool", "POST", "/v1/completions", `{"prompt": "` + strings.Repeat("x", 120) + `", "max_tokens": 9}`, 400, "pool has 8", ""},
		{"body too large", "POST", "/v1/completions", `{"prompt": "` + strings.Repeat("x", 2000) + `"}`, 413, "exceeds 1024 bytes", ""},
		{"tokenize both", "POST", "/tokenize", `{"prompt": "a", "messages": [{"role": "user"}]}`, 400, "not both", ""},
		{"tokenize neither", "POST", "/tokenize", `{}`, 400, "required", ""},
		{"unknown path", "GET", "/v2/nothing", nil, 404, "no route", ""},
		{"wrong method", "GET", "/v1/completions", nil, 405, "use POST", ""},
		{"form body", "POST", "/v1/completions", `{"prompt": "x"}`, 415, "must be application/json", "application/x-www-form-urlencoded"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var body *strings.Reader
			if c.body != nil {
				body = strings.NewReader(string(toJSON(t, c.body)))
			} else {
				body = strings.NewReader("")
			}
			req, _ := http.NewRequest(c.method, te.srv.URL+c.path, body)
			req.Header.Set("Content-Type", c.contentType)
			if c.contentType == "" {
				req.Header.Set("Content-Type", "application/json")
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var e openai.ErrorBody
			if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
				t.Fatalf("status %d, body is not a JSON error: %v", resp.StatusCode, err)
			}
			if resp.StatusCode != c.status || !strings.Contains(e.Error.Message, c.msg) || e.Error.Type == "" || e.Error.Code == nil ||
				c.status == 400 && e.Error.Param == nil && c.name != "bad json" && c.name != "not an object" && c.name != "trailing data" && !strings.HasPrefix(c.name, "tokenize") && c.name != "too large for the pool" {
				t.Fatalf("status %d, error %+v (code %v); want %d with %q", resp.StatusCode, e.Error, e.Error.Code, c.status, c.msg)
			}
		})
	}
	te.checkDrained(t)
}

func TestLifecycle(t *testing.T) {
	e, err := New(fastConfig(), local.NewRadixTree(local.Options{}), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	srvBody := `{"prompt": "x", "max_tokens": 1}`
	do := func() int {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("POST", "/v1/completions", strings.NewReader(srvBody))
		req.Header.Set("Content-Type", "application/json")
		e.Handler().ServeHTTP(rec, req)
		return rec.Code
	}
	if c := do(); c != 503 {
		t.Fatalf("before Start: %d", c)
	}
	if err := e.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if c := do(); c != 200 {
		t.Fatalf("after Start: %d", c)
	}
	e.Close()
	e.Close()
	if c := do(); c != 503 {
		t.Fatalf("after Close: %d", c)
	}
	if _, err := New(fastConfig(), nil, nil, nil); err == nil {
		t.Fatal("New accepted a nil cache")
	}
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	ok := DefaultConfig()
	ok.CPUBlocks, ok.CPUChunkBlocks = MaxCPUBlocks, 16
	if err := ok.Validate(); err != nil {
		t.Fatalf("the largest CPU tier: %v", err)
	}
	for _, mut := range []func(*Config){
		func(c *Config) { c.KVSideChannel, c.KVLeaseDuration, c.KVTransferTokensPerSec = "", 0, 0 }, // no connector
		func(c *Config) { c.KVSideChannel, c.KVSideChannelHost = "0.0.0.0:5600", "node-3.example" },
		func(c *Config) { c.KVLoadFailurePolicy, c.KVRecomputeThreshold = PolicyFail, 64 },
	} {
		c := DefaultConfig()
		mut(&c)
		if err := c.Validate(); err != nil {
			t.Errorf("Validate refused %+v: %v", c, err)
		}
	}
	for _, mut := range []func(*Config){
		func(c *Config) { c.BlockSize = 0 },
		func(c *Config) { c.KVBlocks = 0 },
		func(c *Config) { c.Model = "" },
		func(c *Config) { c.PrefillTokensPerSec = 0 },
		func(c *Config) { c.DecodeTokensPerSec = -1 },
		func(c *Config) { c.TokenBudget = 0 },
		func(c *Config) { c.MaxConcurrent = 0 },
		func(c *Config) { c.MaxQueue = -1 },
		func(c *Config) { c.Tokenizer = "nope" },
		func(c *Config) { c.MaxBodyBytes = 0 },
		func(c *Config) { c.CPUBlocks = -1 },
		func(c *Config) { c.CPUBlocks = MaxCPUBlocks + 1 },
		func(c *Config) { c.CPUChunkBlocks = 0 },
		func(c *Config) { c.CPUBlocks, c.CPUChunkBlocks = 10, 4 },
		func(c *Config) { c.CPULoadTokensPerSec = 0 },
		func(c *Config) { c.KVLoadFailurePolicy = "retry" },
		func(c *Config) { c.KVRecomputeThreshold = -1 },
		func(c *Config) { c.KVLeaseDuration = 0 },
		func(c *Config) { c.KVTransferTokensPerSec = 0 },
		func(c *Config) { c.KVSideChannel = "5600" },
		func(c *Config) { c.KVSideChannel = "0.0.0.0:5600" }, // binds everything, advertises nothing
		func(c *Config) { c.KVSideChannel = ":5600" },
		func(c *Config) { c.EngineID = strings.Repeat("e", maxEngineID+1) },
	} {
		c := DefaultConfig()
		mut(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("Validate accepted %+v", c)
		}
	}
}

func counterValue(t *testing.T, te *testEngine, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := te.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue metric
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// FuzzParse: whatever a client sends, parsing does not panic, and an accepted generation request
// is well-formed.
func FuzzParse(f *testing.F) {
	for _, s := range []string{`{"prompt":"hi","max_tokens":3}`, `{"prompt":[1,2,3]}`, `{"prompt":[[1,2]]}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],"stream":true}`,
		`{"model":"prefixmesh-sim:9","adapter_id":9,"prompt":"x"}`, `{"prompt":[1e10]}`, `null`, `{"prompt":["a"]}`} {
		f.Add([]byte(s))
	}
	e, err := New(fastConfig(), local.NewRadixTree(local.Options{}), nil, nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, parse := range []func([]byte) (*genRequest, error){e.parseCompletion, e.parseChat} {
			req, err := parse(body)
			if err != nil {
				continue
			}
			if len(req.tokens) == 0 || req.maxTokens < 0 || req.model == "" {
				t.Fatalf("accepted a malformed request %+v from %q", req, body)
			}
		}
		_, _ = e.parseTokenize(body)
	})
}
