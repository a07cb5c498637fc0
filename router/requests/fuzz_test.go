package requests

import (
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
		g, err := ParseGen(body, chat, http.Header{})
		if err != nil {
			return
		}
		if chat && len(g.Msgs) == 0 || !chat && g.Text == "" && len(g.Tokens) == 0 {
			t.Fatalf("accepted %q without a prompt", body)
		}
		_, _, _ = resolveModel([]string{"m"}, g.Model, derefU64(g.AdapterID), g.AdapterID != nil)
	})
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*Config){
		"inflight":  func(c *Config) { c.MaxInFlight = 0 },
		"bodies":    func(c *Config) { c.MaxBodyBufferBytes = 0 },
		"connect":   func(c *Config) { c.ConnectTimeout = 0 },
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
