package frontdoor

import (
	"bytes"
	"encoding/json"
	"net/http"
	"testing"
)

// Whatever a client sends, parsing it does not panic, and an accepted request has a prompt.
func FuzzParseGen(f *testing.F) {
	for _, s := range []string{`{"prompt":"x"}`, `{"prompt":[1,2,3]}`, `{"prompt":[[1]]}`, `{"prompt":["a"]}`,
		`{"messages":[{"role":"user","content":"hi"}]}`, `{"messages":[{"role":"user","content":[{"type":"text","text":"a"}]}]}`,
		`{"model":"m:1","adapter_id":1,"prompt":"x","user":"u"}`, `[]`, `{`, `{"prompt":1e40}`} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		g, err := parseGen(body, chat, http.Header{})
		if err != nil {
			return
		}
		if chat && len(g.msgs) == 0 || !chat && g.text == "" && len(g.tokens) == 0 {
			t.Fatalf("accepted %q without a prompt", body)
		}
		_, _, _ = resolveModel([]string{"m"}, g.model, derefU64(g.adapterField), g.adapterField != nil)
	})
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*Config){
		"inflight":  func(c *Config) { c.MaxInFlight = 0 },
		"body":      func(c *Config) { c.MaxBodyBytes = 0 },
		"connect":   func(c *Config) { c.ConnectTimeout = 0 },
		"upstream":  func(c *Config) { c.UpstreamTimeout = -1 },
		"idle":      func(c *Config) { c.MaxIdleConnsPerHost = -1 },
		"tokenizer": func(c *Config) { c.Tokenizer = "nope" },
	} {
		c := DefaultConfig()
		mut(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: invalid config accepted", name)
		}
	}
	c := DefaultConfig()
	c.Tokenizer = TokenizerEngine
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

// The token-id fast path agrees with encoding/json wherever it answers.
func FuzzParseIDs(f *testing.F) {
	for _, s := range []string{`[]`, `[1,2,3]`, ` [ 1 , 2 ]`, `[01]`, `[1,]`, `[,1]`, `[4294967295]`, `[4294967296]`, `[1.0]`, `[-1]`, `[1e3]`, `[[1]]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		ids, ok := parseIDs(bytes.TrimSpace(raw))
		if !ok {
			return
		}
		var want []uint32
		if err := json.Unmarshal(raw, &want); err != nil {
			t.Fatalf("fast path accepted %q, encoding/json refuses it: %v", raw, err)
		}
		if len(ids) != len(want) {
			t.Fatalf("%q: %v, want %v", raw, ids, want)
		}
		for i := range ids {
			if ids[i] != want[i] {
				t.Fatalf("%q: %v, want %v", raw, ids, want)
			}
		}
	})
}
