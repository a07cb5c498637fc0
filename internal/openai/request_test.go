package openai

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestParseCompletionErrorsNameFields(t *testing.T) {
	for _, tc := range []struct{ body, param, msg string }{
		{``, "", "body is empty"},
		{`null`, "", "must be a JSON object, got null"},
		{`[1]`, "", "must be a JSON object, got an array"},
		{`{"prompt":"x"} {}`, "", "trailing data"},
		{`{"prompt":`, "", "invalid JSON"},
		{`{"prompt":"x","max_tokens":"5"}`, "max_tokens", "max_tokens: expected an integer, got string"},
		{`{"prompt":"x","max_tokens":1e40}`, "max_tokens", "expected an integer"},
		{`{"prompt":"x","adapter_id":-1}`, "adapter_id", "expected a non-negative integer"},
		{`{"prompt":"x","stream":"yes"}`, "stream", "expected a boolean"},
		{`{"prompt":"x","max_tokens":0}`, "max_tokens", "max_tokens must be at least 1, got 0"},
		{`{"prompt":"x","max_completion_tokens":-3}`, "max_completion_tokens", "at least 1"},
		{`{"prompt":"x","n":0}`, "n", "at least 1"},
		{`{"prompt":"x","stream_options":{"include_usage":true}}`, "stream_options", "only allowed with stream"},
		{`{"prompt":[1,null]}`, "prompt", "prompt[1]"},
	} {
		_, err := ParseCompletion([]byte(tc.body))
		var e *Error
		if !errors.As(err, &e) {
			t.Errorf("%s: accepted", tc.body)
			continue
		}
		if e.Status != 400 || e.Param != tc.param || !strings.Contains(e.Message, tc.msg) || strings.Contains(e.Message, "int") && !strings.Contains(e.Message, "integer") {
			t.Errorf("%s: %d param %q %q; want param %q and %q", tc.body, e.Status, e.Param, e.Message, tc.param, tc.msg)
		}
	}
	c, err := ParseCompletion([]byte(`{"model":"m","prompt":"hi","max_tokens":5,"max_completion_tokens":7,"stream":true,"stream_options":{"include_usage":true}}`))
	if err != nil || c.MaxTokensOr(16) != 7 || !c.IncludeUsage() || c.Prompt.Items[0].Text != "hi" {
		t.Fatalf("%+v %v", c, err)
	}
}

func TestParseChatErrorsNameMessages(t *testing.T) {
	for _, tc := range []struct{ body, param, msg string }{
		{`{}`, "messages", "required"},
		{`{"messages":[]}`, "messages", "must not be empty"},
		{`{"messages":"hi"}`, "messages", "array of message objects"},
		{`{"messages":[1]}`, "messages[0]", "must be an object"},
		{`{"messages":[{"role":"user","content":"a"},{"role":"","content":"b"}]}`, "messages[1].role", "non-empty"},
		{`{"messages":[{"role":"a<b","content":"x"}]}`, "messages[0].role", "'<'"},
		{`{"messages":[{"role":5,"content":"x"}]}`, "messages[0].role", "expected a string, got number"},
		{`{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}`, "messages[0].content", "only text parts"},
	} {
		_, err := ParseChat([]byte(tc.body))
		var e *Error
		if !errors.As(err, &e) {
			t.Errorf("%s: accepted", tc.body)
			continue
		}
		if e.Param != tc.param || !strings.Contains(e.Message, tc.msg) {
			t.Errorf("%s: param %q %q; want %q and %q", tc.body, e.Param, e.Message, tc.param, tc.msg)
		}
	}
	c, err := ParseChat([]byte(`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}`))
	if err != nil || c.Messages[0].Content != "ab" {
		t.Fatalf("%+v %v", c, err)
	}
}

func TestCheckJSON(t *testing.T) {
	for ct, ok := range map[string]bool{"application/json": true, "application/json; charset=utf-8": true,
		"Application/JSON": true, "": false, "text/plain": false, "application/x-www-form-urlencoded": false} {
		h := http.Header{}
		if ct != "" {
			h.Set("Content-Type", ct)
		}
		err := CheckJSON(h)
		var e *Error
		if ok != (err == nil) || !ok && (!errors.As(err, &e) || e.Status != http.StatusUnsupportedMediaType) {
			t.Errorf("%q: %v", ct, err)
		}
	}
}

func TestWriteErrorRetryAfter(t *testing.T) {
	for _, status := range []int{429, 503} {
		w := httptest.NewRecorder()
		WriteError(w, &Error{Status: status, Code: "x", Message: "m"})
		if w.Header().Get("Retry-After") == "" || w.Code != status {
			t.Errorf("%d: %v", status, w.Header())
		}
	}
	w := httptest.NewRecorder()
	w.Header().Set("Retry-After", "7")
	WriteError(w, &Error{Status: 429, Message: "m"})
	if w.Header().Get("Retry-After") != "7" {
		t.Errorf("caller's Retry-After replaced: %v", w.Header())
	}
	w = httptest.NewRecorder()
	WriteError(w, Invalid("max_tokens", "bad"))
	want := `{"error":{"message":"bad","type":"invalid_request_error","param":"max_tokens","code":"invalid_request"}}`
	if strings.TrimSpace(w.Body.String()) != want || w.Header().Get("Retry-After") != "" {
		t.Errorf("%s %v", w.Body, w.Header())
	}
}

// The prompt's span in the body is the last "prompt" member's value (the one that counts, as in
// encoding/json), so a batch split from it uses the prompts the request was parsed with.
func TestParseCompletionPromptSpan(t *testing.T) {
	body := []byte(`{"prompt": "old", "model":"m", "prompt" :  ["a", "bc"]  , "max_tokens":1}`)
	c, err := ParseCompletion(body)
	if err != nil {
		t.Fatal(err)
	}
	p := c.Prompt
	if got := string(body[p.Start:p.End]); got != `["a", "bc"]` {
		t.Fatalf("prompt span %q, want the last prompt's value", got)
	}
	for i, want := range []string{`"a"`, `"bc"`} {
		it := p.Items[i]
		if got := string(body[p.Start+it.Start : p.Start+it.End]); got != want {
			t.Errorf("item %d span %q, want %q", i, got, want)
		}
	}
}
