package requests

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/prefixmesh/prefixmesh/internal/openai"
	"github.com/prefixmesh/prefixmesh/internal/tokenizer"
	"github.com/prefixmesh/prefixmesh/tokenizer/tokenizertest"
)

// TestEmbeddedHFTokenizer: with hf:DIR the service renders chats with the model's template
// from the whole body, adds the BOS to text prompts, answers 400 for a chat the template
// refuses, and routes a request it cannot tokenize exactly without tokens (not approximately).
func TestEmbeddedHFTokenizer(t *testing.T) {
	tok, err := tokenizer.New(tokenizer.HFPrefix + tokenizertest.Dir(t, "llama3_1"))
	if err != nil {
		t.Fatal(err)
	}
	inexactVec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "inexact"}, []string{"reason"})
	e := embeddedTokenizer{tok: tok, inexact: inexactVec}
	ctx := context.Background()
	parse := func(body string, chat bool) *GenRequest {
		t.Helper()
		g, err := ParseGen([]byte(body), chat, http.Header{})
		if err != nil {
			t.Fatal(err)
		}
		return g
	}

	chat := `{"model": "m", "messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": false}`
	got, err := e.tokens(ctx, parse(chat, true), "")
	want, werr := tokenizer.EncodeChat(ctx, tok, []byte(chat), nil)
	if err != nil || werr != nil || len(got) == 0 || !equalU32(got, want) {
		t.Fatalf("chat: %v %v, want %v", got, err, want)
	}
	if got, err := e.tokens(ctx, parse(`{"prompt": "Hello, world!"}`, false), ""); err != nil || !equalU32(got, []uint32{128000, 9906, 11, 1917, 0}) {
		t.Fatalf("text prompt: %v %v", got, err)
	}

	_, err = e.tokens(ctx, parse(`{"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": true, "continue_final_message": true}`, true), "")
	var he *openai.Error
	if !errors.As(err, &he) || he.Status != http.StatusBadRequest {
		t.Fatalf("conflicting flags: %v, want a 400", err)
	}

	// 1.0 in tool-call arguments: vLLM accepts it and this template never prints it.
	float := `{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{\"t\": 1.0}"}}]}]}`
	if got, err := e.tokens(ctx, parse(float, true), ""); err != nil || len(got) == 0 {
		t.Fatalf("1.0 in tool-call arguments: %v %v, want tokens", got, err)
	}
	// Two integers beyond int64 that round to one float64 cannot be printed apart: counted and
	// routed without tokens.
	inexact := `{"messages": [{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{\"a\": 18446744073709551616, \"b\": 18446744073709551617}"}}]}]}`
	if got, err := e.tokens(ctx, parse(inexact, true), ""); err != nil || got != nil {
		t.Fatalf("inexact request: %v %v, want no tokens and no error", got, err)
	}
	var m dto.Metric
	if err := inexactVec.WithLabelValues("big_integer").Write(&m); err != nil || m.GetCounter().GetValue() != 1 {
		t.Fatalf("tokenize_inexact_total{reason=big_integer} = %v (%v), want 1", m.GetCounter().GetValue(), err)
	}
}

func equalU32(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
