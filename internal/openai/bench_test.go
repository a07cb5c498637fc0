package openai

import (
	"strconv"
	"strings"
	"testing"
)

// idsBody is a completions body whose prompt is n token ids below 100,256 (cl100k_base's
// vocabulary), joined by sep.
func idsBody(n int, sep string) []byte {
	ids := make([]string, n)
	x := uint32(12345)
	for i := range ids {
		x = x*1664525 + 1013904223 // a fixed LCG: the same ids every run
		ids[i] = strconv.Itoa(int(x % 100256))
	}
	return []byte(`{"model":"m","prompt":[` + strings.Join(ids, sep) + `],"max_tokens":8}`)
}

// BenchmarkParseCompletionIDs parses an 8,192-id completions body as Go's encoder writes it
// (",") and as Python's json.dumps does (", ").
func BenchmarkParseCompletionIDs(b *testing.B) {
	for _, sep := range []string{",", ", "} {
		body := idsBody(8192, sep)
		b.Run(strconv.Quote(sep), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				c, err := ParseCompletion(body)
				if err != nil {
					b.Fatal(err)
				}
				if len(c.Prompt.Items) != 1 || len(c.Prompt.Items[0].IDs) != 8192 {
					b.Fatalf("parsed %+v", c.Prompt.Items)
				}
				ReleaseIDs(c.Prompt.Items[0].IDs)
			}
		})
	}
}
