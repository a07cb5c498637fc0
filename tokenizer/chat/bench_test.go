package chat

import (
	"encoding/json"
	"fmt"
	"os"
	"testing"
)

// conversation returns a chat request body of turns user/assistant pairs drawn from the
// benchmark corpus (each message ~1 KB), ending with a user message.
func conversation(tb testing.TB, turns int) []byte {
	tb.Helper()
	b, err := os.ReadFile("../testdata/bench/corpus.txt")
	if err != nil {
		tb.Fatal(err)
	}
	text := string(b)
	msgs := []map[string]any{{"role": "system", "content": "You are a careful assistant for operators of LLM fleets."}}
	for i := 0; i < turns; i++ {
		off := (i * 397) % (len(text) - 1200)
		msgs = append(msgs, map[string]any{"role": "user", "content": fmt.Sprintf("Question %d: %s", i, text[off:off+600])},
			map[string]any{"role": "assistant", "content": fmt.Sprintf("Answer %d: %s", i, text[off+600:off+1200])})
	}
	msgs = append(msgs, map[string]any{"role": "user", "content": "And the next step?"})
	body, err := json.Marshal(map[string]any{"messages": msgs})
	if err != nil {
		tb.Fatal(err)
	}
	return body
}

// BenchmarkNextTurn measures turn N+1 of a ~32k-token Qwen3 conversation: tokenizing its prompt
// with the segment cache warm from turn N (only the new messages are tokenized), without the
// cache, and rendering the template.
func BenchmarkNextTurn(b *testing.B) {
	tm := loadTemplate(b, "qwen3")
	turns := 1
	for {
		r, err := ParseRequest(conversation(b, turns))
		if err != nil {
			b.Fatal(err)
		}
		s, _ := tm.Render(r)
		if len(tm.tok.Encode(s, false)) >= 32000 {
			break
		}
		turns += 4
	}
	prevReq, _ := ParseRequest(conversation(b, turns-1))
	prev, _ := tm.Render(prevReq)
	nextReq, _ := ParseRequest(conversation(b, turns))
	next, _ := tm.Render(nextReq)
	n := len(tm.tok.Encode(next, false))
	b.Run("encode-cached", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			tm.tok.Encode(prev, false) // turn N is in the cache, as it would be after serving it
			b.StartTimer()
			tm.tok.Encode(next, false)
		}
		b.ReportMetric(float64(n), "tokens/op")
	})
	b.Run("encode-uncached", func(b *testing.B) {
		uncached := tm.tok.WithoutSegmentCache()
		for i := 0; i < b.N; i++ {
			uncached.Encode(next, false)
		}
		b.ReportMetric(float64(n), "tokens/op")
	})
	b.Run("render", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if _, err := tm.Render(nextReq); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(len(next)), "bytes/op")
	})
	b.Run("parse", func(b *testing.B) {
		body := conversation(b, turns)
		for i := 0; i < b.N; i++ {
			if _, err := ParseRequest(body); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(len(body)), "bytes/op")
	})
}
