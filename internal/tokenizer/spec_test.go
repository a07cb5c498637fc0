package tokenizer

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	hf "github.com/prefixmesh/prefixmesh/tokenizer"
	"github.com/prefixmesh/prefixmesh/tokenizer/tokenizertest"
)

type chatGolden struct {
	Cases []struct {
		Name    string          `json:"name"`
		Request json.RawMessage `json:"request"`
		IDs     []uint32        `json:"ids"`
		Error   string          `json:"error"`
	} `json:"cases"`
}

// TestHFChatAndPrompt: hf:DIR gives the golden ids for chat requests (through EncodeChat, the
// call both the router and the engine make) and adds the BOS to completion prompts only.
func TestHFChatAndPrompt(t *testing.T) {
	for _, m := range []string{"llama3_1", "qwen3", "deepseek_v3", "gemma3"} {
		t.Run(m, func(t *testing.T) {
			tok := mustNew(t, HFPrefix+tokenizertest.Dir(t, m))
			if again := mustNew(t, HFPrefix+tokenizertest.Dir(t, m)); again != tok {
				t.Error("a directory was loaded twice")
			}
			b, err := os.ReadFile(tokenizertest.Golden("chat_" + m + ".json"))
			if err != nil {
				t.Fatal(err)
			}
			var g chatGolden
			if err := json.Unmarshal(b, &g); err != nil {
				t.Fatal(err)
			}
			for _, c := range g.Cases {
				ids, err := EncodeChat(context.Background(), tok, c.Request, nil)
				if c.Error != "" {
					if err == nil {
						t.Errorf("%s: no error, want %q", c.Name, c.Error)
					}
					continue
				}
				if err != nil || !equalIDs(ids, c.IDs) {
					t.Errorf("%s: got %d ids (err %v), want %d", c.Name, len(ids), err, len(c.IDs))
				}
			}
			plain := tok.Encode("Hello")
			prompt, err := EncodePrompt(context.Background(), tok, "Hello")
			if err != nil {
				t.Fatal(err)
			}
			bos := m != "qwen3"
			if bos != (len(prompt) == len(plain)+1) {
				t.Errorf("prompt %v, plain %v: BOS expected %v", prompt, plain, bos)
			}
			if got := tok.Decode(append(plain, 1<<30)); got != "Hello\uFFFD" {
				t.Errorf("decode with an unknown id: %q", got)
			}
		})
	}
}

func TestHFChatErrors(t *testing.T) {
	tok := mustNew(t, HFPrefix+tokenizertest.Dir(t, "qwen3"))
	for body, want := range map[string]error{
		`{"messages": []}`: ErrBadChat,
		`{"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": true, "continue_final_message": true}`: ErrBadChat,
		`{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}`:                  ErrBadChat,
		// two integers beyond int64 that round to one float64: their digits cannot be told apart
		`{"messages": [{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{\"a\": 18446744073709551616, \"b\": 18446744073709551617}"}}]}]}`: ErrInexact,
	} {
		_, err := EncodeChat(context.Background(), tok, []byte(body), nil)
		if !errors.Is(err, want) {
			t.Errorf("%s: got %v, want %v", body, err, want)
		}
		if want == ErrInexact && InexactReason(err) != "big_integer" {
			t.Errorf("%s: reason %q, want big_integer", body, InexactReason(err))
		}
	}
	// 1.0 in tool-call arguments renders: Qwen3's template prints arguments with tojson only.
	if _, err := EncodeChat(context.Background(), tok, []byte(`{"messages": [{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{\"t\": 1.0}"}}]}]}`), nil); err != nil {
		t.Errorf("1.0 in tool-call arguments: %v", err)
	}
	llama2 := mustNew(t, HFPrefix+tokenizertest.Dir(t, "llama2"))
	_, err := EncodeChat(context.Background(), llama2, []byte(`{"messages": [{"role": "user", "content": "hi"}]}`), nil)
	if !IsInexact(err) || InexactReason(err) != "no_chat_template" {
		t.Errorf("a tokenizer without a template: %v (reason %q)", err, InexactReason(err))
	}
	if n := strings.Count(err.Error(), hf.ErrUnsupported.Error()); n != 1 {
		t.Errorf("%q says %q %d times", err, hf.ErrUnsupported, n)
	}
}

func TestHFBadSpec(t *testing.T) {
	for _, spec := range []string{"hf:", "hf:/nonexistent/dir", "render:ftp://x", "render:"} {
		if _, err := New(spec); err == nil {
			t.Errorf("New(%q) accepted", spec)
		}
	}
}

// TestRender: the render tokenizer posts chat bodies unchanged to /v1/chat/completions/render
// and prompts to /v1/completions/render, and reads their token_ids; a /tokenize URL is used as is.
func TestRender(t *testing.T) {
	var lastPath, lastBody string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		lastPath, lastBody = r.URL.Path, string(b)
		switch r.URL.Path {
		case "/v1/chat/completions/render":
			_, _ = w.Write([]byte(`{"request_id": "x", "token_ids": [1, 2, 3], "sampling_params": {}}`))
		case "/v1/completions/render":
			_, _ = w.Write([]byte(`[{"token_ids": [7, 8]}]`))
		case "/tokenize":
			_, _ = w.Write([]byte(`{"count": 1, "tokens": [9]}`))
		case "/bad/v1/chat/completions/render":
			http.Error(w, `{"error": {"message": "nope"}}`, http.StatusBadRequest)
		default:
			http.Error(w, "boom", http.StatusInternalServerError)
		}
	}))
	defer srv.Close()
	ctx := context.Background()
	r := mustNew(t, RenderPrefix+srv.URL+"/")
	body := `{"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": []}`
	if ids, err := EncodeChat(ctx, r, []byte(body), nil); err != nil || !equalIDs(ids, []uint32{1, 2, 3}) || lastBody != body {
		t.Fatalf("chat: %v %v, body sent %q", ids, err, lastBody)
	}
	if ids, err := EncodePrompt(ctx, r, "hello"); err != nil || !equalIDs(ids, []uint32{7, 8}) || lastPath != "/v1/completions/render" ||
		!strings.Contains(lastBody, `"add_special_tokens":true`) {
		t.Fatalf("prompt: %v %v %s %s", ids, err, lastPath, lastBody)
	}
	tz := mustNew(t, RenderPrefix+srv.URL+"/tokenize")
	if ids, err := EncodeChat(ctx, tz, []byte(body), nil); err != nil || !equalIDs(ids, []uint32{9}) {
		t.Fatalf("tokenize: %v %v", ids, err)
	}
	bad := mustNew(t, RenderPrefix+srv.URL+"/bad")
	if _, err := EncodeChat(ctx, bad, []byte(body), nil); !errors.Is(err, ErrBadChat) {
		t.Fatalf("a 400 from the server: %v", err)
	}
	broken := mustNew(t, RenderPrefix+srv.URL+"/broken")
	if _, err := EncodeChat(ctx, broken, []byte(body), nil); err == nil || errors.Is(err, ErrBadChat) {
		t.Fatalf("a 500 from the server: %v", err)
	}
}

func equalIDs(a, b []uint32) bool {
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

// FuzzParseRenderAnswer: a render server's answer decodes to ids or an error, never a panic.
func FuzzParseRenderAnswer(f *testing.F) {
	for _, s := range []string{`{"token_ids": [1, 2]}`, `[{"token_ids": [3]}]`, `{"tokens": [4]}`, `[]`, `{"token_ids": [-1]}`, `[{}, {}]`, `null`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		ids, err := parseRenderAnswer(b)
		if err == nil && ids == nil {
			t.Fatalf("%q: no ids and no error", b)
		}
	})
}
