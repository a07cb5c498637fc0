package tokenizer

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// benchText reads a benchmark corpus (testdata/bench; bench.mjs times HF's Rust core on the
// same text) repeated to size bytes, cut at a space.
func benchText(tb testing.TB, file string, size int) string {
	tb.Helper()
	b, err := os.ReadFile("testdata/bench/" + file)
	if err != nil {
		tb.Fatal(err)
	}
	s := string(b)
	for len(s) < size {
		s += string(b)
	}
	return s[:strings.LastIndexByte(s[:size], ' ')+1]
}

// BenchmarkEncode is the throughput comparison with HF's Rust core (bench.mjs): 32 KiB of text
// per op, the word cache warm (steady state), the segment cache off.
func BenchmarkEncode(b *testing.B) {
	for _, m := range []string{"llama3_1", "qwen3", "deepseek_v3", "llama2", "gemma3"} {
		for _, file := range []string{"corpus.txt", "adversarial.txt"} {
			b.Run(m+"/"+strings.TrimSuffix(file, ".txt")+"32k", func(b *testing.B) {
				tk := *loadModel(b, m)
				tk.segs = newSegmentCache(0)
				text := benchText(b, file, 32<<10)
				dst := tk.AppendEncode(nil, text, false)
				b.SetBytes(int64(len(text)))
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					dst = tk.AppendEncode(dst[:0], text, false)
				}
				b.ReportMetric(float64(len(dst)), "tokens/op")
			})
		}
	}
}

// BenchmarkPrompt8k encodes an 8k-token prompt (Llama-3.1), with the word cache warm (steady
// state) and cold (a fresh tokenizer's first prompt).
func BenchmarkPrompt8k(b *testing.B) {
	base := loadModel(b, "llama3_1")
	text := benchText(b, "corpus.txt", 64<<10)
	// Cut to 8192 tokens' worth of text.
	probe := *base
	probe.segs = newSegmentCache(0)
	lo, hi := 0, len(text)
	for lo < hi {
		mid := (lo + hi) / 2
		if len(probe.Encode(text[:mid], true)) < 8192 {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	text = text[:lo]
	for _, warm := range []bool{true, false} {
		b.Run(fmt.Sprintf("warm=%v", warm), func(b *testing.B) {
			tk := *base
			tk.segs = newSegmentCache(0)
			tk.words = newWordCache()
			n := len(tk.Encode(text, true))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if !warm {
					b.StopTimer()
					tk.words = newWordCache()
					b.StartTimer()
				}
				tk.Encode(text, true)
			}
			b.ReportMetric(float64(n), "tokens/op")
		})
	}
}
