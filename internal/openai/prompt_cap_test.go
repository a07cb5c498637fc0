package openai

import (
	"bytes"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// idArray is a JSON array of n token ids ("1,1,…,1"), built in one allocation.
func idArray(n int) []byte {
	b := make([]byte, 0, 2*n+1)
	b = append(b, '[')
	b = append(b, bytes.Repeat([]byte("1,"), n-1)...)
	return append(b, "1]"...)
}

// A prompt of more than MaxPromptTokens token ids is refused with 413 naming the limit, and the
// parser stops at the first id past the cap: its steps (one per byte read) stay within the
// bytes of MaxPromptTokens+1 ids, not the 8 MB of a 4M-token array.
func TestPromptTokenCap(t *testing.T) {
	const n = 4_000_000
	raw := idArray(n)
	_, err, steps := parseSteps(raw)
	var e *Error
	if !errors.As(err, &e) || e.Status != http.StatusRequestEntityTooLarge || !strings.Contains(e.Message, strconv.Itoa(MaxPromptTokens)) {
		t.Fatalf("4M-token prompt: %v, want a 413 naming %d", err, MaxPromptTokens)
	}
	if limit := 2*(MaxPromptTokens+1) + 64; steps > limit {
		t.Fatalf("the parser took %d steps over a %d-byte array, want at most %d (the cap's bytes)", steps, len(raw), limit)
	}
	// Exactly at the cap is a prompt; one more is not. The same cap holds for a batch's items
	// and for a whole-request parse.
	if p, err := ParsePrompt(idArray(MaxPromptTokens)); err != nil || len(p.Items[0].IDs) != MaxPromptTokens {
		t.Fatalf("a prompt at the cap: %v", err)
	}
	for name, raw := range map[string][]byte{
		"single":  idArray(MaxPromptTokens + 1),
		"batch":   append(append([]byte("[[1],"), idArray(MaxPromptTokens+1)...), ']'),
		"request": append(append([]byte(`{"model":"m","prompt":`), idArray(MaxPromptTokens+1)...), '}'),
	} {
		var err error
		if name == "request" {
			_, err = ParseCompletion(raw)
		} else {
			_, err = ParsePrompt(raw)
		}
		if !errors.As(err, &e) || e.Status != http.StatusRequestEntityTooLarge {
			t.Fatalf("%s over the cap: %v, want 413", name, err)
		}
	}
	if err := CheckPromptTokens(MaxPromptTokens); err != nil {
		t.Fatalf("CheckPromptTokens at the cap: %v", err)
	}
	if err := CheckPromptTokens(MaxPromptTokens + 1); !errors.As(err, &e) || e.Status != http.StatusRequestEntityTooLarge {
		t.Fatalf("CheckPromptTokens over the cap: %v", err)
	}
}
