package tokenizer

import (
	"testing"

	"github.com/prefixmesh/prefixmesh/internal/testenv"
)

// TestAllocsEncode backs the claim that encoding allocates nothing in steady state when the
// caller's slice has room: 32 KiB of the benchmark corpus, the word cache warm.
func TestAllocsEncode(t *testing.T) {
	testenv.SkipAllocsUnderRace(t)
	for _, m := range []string{"llama3_1", "qwen3"} {
		tk := loadModel(t, m)
		text := benchText(t, "corpus.txt", 32<<10)
		dst := tk.AppendEncode(nil, text, false)
		if n := testing.AllocsPerRun(20, func() { dst = tk.AppendEncode(dst[:0], text, false) }); n != 0 {
			t.Errorf("%s: AppendEncode of 32 KiB allocated %.1f times per call, want 0", m, n)
		}
	}
}
