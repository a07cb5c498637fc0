package frontdoor

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/prefixmesh/prefixmesh/internal/tokenizer"
	"github.com/prefixmesh/prefixmesh/router/requests"
)

// With the embedded tokenizer replaced by the engine's /tokenize, estimates still equal the
// engine's cached_tokens: both sides tokenise with the same code.
func TestEngineTokenizer(t *testing.T) {
	f := startFleet(t, fleetOpts{nodes: 2, svc: func(c *requests.Config) { c.Tokenizer = requests.TokenizerEngine }})
	msgs := []tokenizer.ChatMessage{{Role: "system", Content: systemPrompt(1)}}
	for turn := range 4 {
		msgs = append(msgs, tokenizer.ChatMessage{Role: "user", Content: fmt.Sprintf("turn %d", turn)})
		f.syncIndex(t)
		r, err := do(t.Context(), http.DefaultClient, f.srv.URL, "/v1/chat/completions", chatBody(msgs, turn%2 == 0, 4), nil)
		if err != nil || r.status != 200 {
			t.Fatalf("turn %d: %+v %v", turn, r, err)
		}
		if r.estimate != r.cached || (turn > 0 && r.cached == 0) {
			t.Fatalf("turn %d: estimate %d, cached %d", turn, r.estimate, r.cached)
		}
		msgs = append(msgs, tokenizer.ChatMessage{Role: "assistant", Content: r.text})
	}
	sc := requests.DefaultConfig()
	sc.Tokenizer = requests.TokenizerEngine
	if _, err := requests.New(sc, requests.Deps{Picker: f.picker}); err == nil {
		t.Fatal("engine tokenizer without Deps.Nodes accepted")
	}
}

// With --tokenizer none, token ids are routed and text is refused with 400.
func TestTokenizerNone(t *testing.T) {
	f := startFleet(t, fleetOpts{nodes: 1, svc: func(c *requests.Config) { c.Tokenizer = requests.TokenizerNone }})
	r, err := do(t.Context(), http.DefaultClient, f.srv.URL, "/v1/completions", `{"prompt":[1,2,3],"max_tokens":1}`, nil)
	if err != nil || r.status != 200 {
		t.Fatalf("ids: %+v %v", r, err)
	}
	resp, err := http.Post(f.srv.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"text"}`))
	if err != nil {
		t.Fatal(err)
	}
	checkError(t, "text without tokenizer", resp, http.StatusBadRequest, codeInvalid, "token ids")
}
