package tokenizer

import (
	"os"
	"strings"
	"testing"
)

// benchText is the corpus of the speed comparison with HF's Rust core (tokenizer/testdata/bench
// /bench.mjs reads the same file): real-looking mixed text, repeated to size.
func benchText(tb testing.TB, bytes int) string {
	tb.Helper()
	b, err := os.ReadFile("testdata/bench/corpus.txt")
	if err != nil {
		tb.Fatal(err)
	}
	s := string(b)
	for len(s) < bytes {
		s += string(b)
	}
	return s[:strings.LastIndexByte(s[:bytes], ' ')+1]
}

func BenchmarkEncode(b *testing.B) {
	for _, m := range []string{"llama3_1", "qwen3", "deepseek_v3", "llama2"} {
		b.Run(m, func(b *testing.B) {
			tk := loadModel(b, m)
			text := benchText(b, 32<<10)
			tk.segs = newSegmentCache(0) // measure tokenization, not the segment cache
			n := len(tk.Encode(text, false))
			b.SetBytes(int64(len(text)))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				tk.Encode(text, false)
			}
			b.ReportMetric(float64(n), "tokens/op")
		})
	}
}
