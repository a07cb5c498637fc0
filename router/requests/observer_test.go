package requests

import (
	"strings"
	"testing"
	"time"
)

// The observer finds the first output token, the usage's cached_tokens and [DONE] however the
// stream is cut into reads, and reads a JSON body's usage when no header said it.
func TestObserver(t *testing.T) {
	stream := "data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n" +
		": keep-alive comment\n\n" +
		"data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" hi\"}}]}\r\n\r\n" +
		"data: {\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"prompt_tokens_details\":{\"cached_tokens\":32}}}\n\n" +
		"data: [DONE]\n\n"
	for cut := 1; cut <= len(stream); cut += 7 {
		firsts := 0
		o := NewObserver(true, time.Now(), -1, func() { firsts++ })
		for i := 0; i < len(stream); i += cut {
			o.Write([]byte(stream[i:min(i+cut, len(stream))]))
		}
		o.Finish()
		if o.cached != 32 || o.ttft <= 0 || !o.done || firsts != 1 {
			t.Fatalf("reads of %d bytes: cached %d ttft %v done %v firsts %d", cut, o.cached, o.ttft, o.done, firsts)
		}
	}
	// A role-only stream has no first token.
	o := NewObserver(true, time.Now(), 7, nil)
	o.Write([]byte(stream[:strings.Index(stream, ": keep")]))
	if o.ttft != 0 || o.cached != 7 {
		t.Fatalf("role chunk: ttft %v cached %d", o.ttft, o.cached)
	}
	// JSON bodies: the usage, unless it exceeds the scan cap.
	o = NewObserver(false, time.Now(), -1, nil)
	o.Write([]byte(`{"usage":{"prompt_tokens_details":`))
	o.Write([]byte(`{"cached_tokens":16}}}`))
	o.Finish()
	if o.cached != 16 {
		t.Fatalf("body usage: %d", o.cached)
	}
	o = NewObserver(false, time.Now(), -1, nil)
	o.Write(make([]byte, maxUsageScanBytes+1))
	o.Finish()
	if o.cached != -1 || o.body != nil {
		t.Fatalf("oversized body kept: cached %d, %d bytes", o.cached, len(o.body))
	}
	// An SSE line over the cap is skipped, and the next line is still read.
	o = NewObserver(true, time.Now(), -1, nil)
	o.Write([]byte("data: " + strings.Repeat("x", maxSSELineBytes) + "\n\ndata: [DONE]\n\n"))
	if !o.done || len(o.line) != 0 {
		t.Fatalf("after an oversized line: done %v, line %d bytes", o.done, len(o.line))
	}
}

// hasOutput's quick path and its decoding agree on the chunks engines send.
func TestHasOutput(t *testing.T) {
	for _, c := range []struct {
		chunk string
		want  bool
	}{
		{`{"id":"c","choices":[{"index":0,"text":" word","logprobs":null,"finish_reason":null}]}`, true},
		{`{"id":"c","choices":[{"index":0,"text":"","finish_reason":"length"}],"usage":{"prompt_tokens":3}}`, false},
		{`{"id":"c","choices":[{"index":0, "text": "spaced"}]}`, true},
		{`{"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`, false},
		{`{"id":"c","choices":[{"index":0,"delta":{"content":"hi"}}]}`, true},
		{`{"id":"c","choices":[{"text":""}],"note":"\"text\":\"y"}`, false},
		{`{"id":"c","choices":[]}`, false},
	} {
		if got := hasOutput([]byte(c.chunk)); got != c.want {
			t.Errorf("hasOutput(%s) = %v, want %v", c.chunk, got, c.want)
		}
	}
}
