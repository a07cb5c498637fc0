package tokenizer

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// sweepContexts are testdata/gen/sweep.mjs's contexts, in its order.
var sweepContexts = []struct {
	name string
	f    func(c string) string
}{
	{"alone", func(c string) string { return c + "\n" }},
	{"context", func(c string) string { return "x " + c + "1" + c + "23a" + c + "\u0323'" + c + "\n" }},
}

type sweepGolden struct {
	BlockSize int                          `json:"block_size"`
	Models    map[string]map[string]string `json:"models"`
}

// sweepBlock is block b's string for one context (sweep.mjs's blockChars and join).
func sweepBlock(b, size int, f func(string) string) string {
	var sb strings.Builder
	for c := rune(b * size); c < rune((b+1)*size); c++ {
		if c >= 0xD800 && c < 0xE000 {
			continue
		}
		sb.WriteString(f(string(c)))
	}
	return sb.String()
}

func idsDigest(ids []uint32) string {
	h := sha256.New()
	var b [4]byte
	for _, id := range ids {
		binary.LittleEndian.PutUint32(b[:], id)
		h.Write(b[:])
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// sweepBlockInRaceRun: under the race detector (ten times slower, and the sweep has no
// concurrency to check) the sweep covers every 16th block and the blocks of the characters
// first found to differ (U+0898 in block 0, U+1CCF0, U+2EBF0); without it, every block
// (go test -count=1 -run CodePointSweep ./tokenizer/: about 45 s of CPU for the six models).
func sweepBlockInRaceRun(blk, size int) bool {
	return blk%16 == 0 || blk == 0x1CCF0/size || blk == 0x2EBF0/size
}

// TestCodePointSweep encodes every Unicode scalar value, alone and in context, on each model and
// compares digests of the ids per block of code points with HF's (testdata/golden/sweep.json):
// it pins the Unicode versions of the pre-tokenizer classes and of NFC over the whole range.
// A differing block is printed with the command that lists the oracle's ids for it.
func TestCodePointSweep(t *testing.T) {
	if testing.Short() {
		t.Skip("the sweep encodes 1.1M code points per model; not in -short")
	}
	b, err := os.ReadFile(filepath.Join("testdata", "golden", "sweep.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g sweepGolden
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	if g.BlockSize <= 0 || 0x110000%g.BlockSize != 0 || len(g.Models) == 0 {
		t.Fatalf("sweep.json: bad block size %d or no models", g.BlockSize)
	}
	nblocks := 0x110000 / g.BlockSize
	for _, m := range []string{"llama3", "llama3_1", "qwen3", "deepseek_v3", "llama2", "gemma3"} {
		t.Run(m, func(t *testing.T) {
			want, ok := g.Models[m]
			if !ok {
				t.Fatalf("sweep.json has no %s", m)
			}
			tk := loadModel(t, m)
			for _, ctx := range sweepContexts {
				ds := strings.Fields(want[ctx.name])
				if len(ds) != nblocks {
					t.Fatalf("%s: %d digests, want %d", ctx.name, len(ds), nblocks)
				}
				bad, checked := 0, 0
				for blk := 0; blk < nblocks; blk++ {
					if raceEnabled && !sweepBlockInRaceRun(blk, g.BlockSize) {
						continue
					}
					checked++
					got := idsDigest(tk.Encode(sweepBlock(blk, g.BlockSize, ctx.f), false))
					if got != ds[blk] {
						bad++
						if bad <= 5 {
							t.Errorf("%s: block U+%04X–U+%04X differs from HF (ids per code point: node tokenizer/testdata/gen/sweep.mjs %s 0x%x)",
								ctx.name, blk*g.BlockSize, (blk+1)*g.BlockSize-1, m, blk*g.BlockSize)
						}
					}
				}
				if bad > 0 {
					t.Errorf("%s: %d of %d blocks differ", ctx.name, bad, checked)
				}
			}
		})
	}
}

// TestUnicodeCases: strings whose ids depend on the Unicode tables and NFC details (runs of more
// than 30 combining marks, marks newer than 9.0.0, Unicode 16.0 letters and digits, case-folded
// contractions) against HF's ids (testdata/golden/unicode_cases.json).
func TestUnicodeCases(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "golden", "unicode_cases.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		Models map[string][]struct {
			Text string   `json:"text"`
			IDs  []uint32 `json:"ids"`
		} `json:"models"`
	}
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"llama3", "llama3_1", "qwen3", "deepseek_v3", "llama2", "gemma3"} {
		t.Run(m, func(t *testing.T) {
			if len(g.Models[m]) == 0 {
				t.Fatalf("unicode_cases.json has no %s", m)
			}
			tk := loadModel(t, m)
			for _, c := range g.Models[m] {
				if got := tk.Encode(c.Text, false); firstDiff(got, c.IDs) >= 0 {
					t.Errorf("%+q: got %v want %v", c.Text, got, c.IDs)
				}
			}
		})
	}
}
