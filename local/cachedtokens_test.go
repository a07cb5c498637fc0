package local

import "testing"

func TestEngineCachedTokens(t *testing.T) {
	for _, c := range []struct{ matched, prompt, bs, want int }{
		{32, 32, 16, 16}, // fully cached, N a multiple of B: the last block is recomputed
		{32, 33, 16, 32}, // fully cached full blocks and one more token: all of them count
		{16, 40, 16, 16},
		{0, 40, 16, 0},
		{16, 16, 16, 0}, // one-block prompt: the only block holds the last token
		{48, 40, 16, 32},
		{20, 40, 16, 16}, // a sub-block match counts whole blocks only
		{16, 1, 16, 0},
		{16, 0, 16, 0},
		{16, 40, 0, 0},
		{-5, 40, 16, 0},
	} {
		if got := EngineCachedTokens(c.matched, c.prompt, c.bs); got != c.want {
			t.Errorf("EngineCachedTokens(%d, %d, %d) = %d, want %d", c.matched, c.prompt, c.bs, got, c.want)
		}
	}
}
