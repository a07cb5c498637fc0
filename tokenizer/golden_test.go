package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"testing"

	"github.com/prefixmesh/prefixmesh/tokenizer/tokenizertest"
)

// goldenModels are the model files the goldens cover (scripts/fetch-tokenizers.sh), then the
// rewrites of testdata/gen/variants.json.
func goldenModels(tb testing.TB) []string {
	out := []string{"llama3", "llama3_1", "qwen3", "deepseek_v3", "llama2", "gemma3"}
	for name := range readVariants(tb) {
		out = append(out, name)
	}
	sort.Strings(out[6:])
	return out
}

// variant is one rewrite of a shipped file (gen.mjs applies the same).
type variant struct {
	Base  string                     `json:"base"`
	Set   map[string]json.RawMessage `json:"set"`
	Added map[string]map[string]any  `json:"added"`
}

func readVariants(tb testing.TB) map[string]variant {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "gen", "variants.json"))
	if err != nil {
		tb.Fatal(err)
	}
	var v map[string]variant
	if err := json.Unmarshal(b, &v); err != nil {
		tb.Fatal(err)
	}
	return v
}

// loadVariant applies a rewrite to its base model's file (top-level keys replaced as raw JSON,
// so the big vocabulary is not decoded twice).
func loadVariant(dir string, v variant) (*Tokenizer, error) {
	b, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return nil, err
	}
	var tj map[string]json.RawMessage
	if err := json.Unmarshal(b, &tj); err != nil {
		return nil, err
	}
	for k, raw := range v.Set {
		tj[k] = raw
	}
	if len(v.Added) > 0 {
		var added []map[string]any
		if err := json.Unmarshal(tj["added_tokens"], &added); err != nil {
			return nil, err
		}
		for _, at := range added {
			for k, val := range v.Added[at["content"].(string)] {
				at[k] = val
			}
		}
		if tj["added_tokens"], err = json.Marshal(added); err != nil {
			return nil, err
		}
	}
	nb, err := json.Marshal(tj)
	if err != nil {
		return nil, err
	}
	cb, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil {
		return nil, err
	}
	return Load(nb, cb)
}

func modelDir(tb testing.TB, model string) string { return tokenizertest.Dir(tb, model) }

var loaded sync.Map // model → *Tokenizer

func loadModel(tb testing.TB, model string) *Tokenizer {
	tb.Helper()
	v, isVariant := readVariants(tb)[model]
	base := model
	if isVariant {
		base = v.Base
	}
	dir := modelDir(tb, base)
	if t, ok := loaded.Load(model); ok {
		return t.(*Tokenizer)
	}
	var t *Tokenizer
	var err error
	if isVariant {
		t, err = loadVariant(dir, v)
	} else {
		t, err = LoadDir(dir)
	}
	if err != nil {
		tb.Fatalf("load %s: %v", model, err)
	}
	loaded.Store(model, t)
	return t
}

type goldenCase struct {
	Text       string   `json:"text"`
	IDs        []uint32 `json:"ids"`
	IDsSpecial []uint32 `json:"ids_special"`
	Decoded    string   `json:"decoded"`
}

func readGolden(tb testing.TB, model string) []goldenCase {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "golden", model+".json"))
	if err != nil {
		tb.Fatal(err)
	}
	var g struct {
		Cases []goldenCase `json:"cases"`
	}
	if err := json.Unmarshal(b, &g); err != nil {
		tb.Fatal(err)
	}
	return g.Cases
}

// firstDiff is the first index where a and b differ (len of the shorter if one is a prefix).
func firstDiff(a, b []uint32) int {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	if i == len(a) && i == len(b) {
		return -1
	}
	return i
}

func TestGoldenEncode(t *testing.T) {
	for _, m := range goldenModels(t) {
		t.Run(m, func(t *testing.T) {
			tk := loadModel(t, m)
			bad := 0
			for i, c := range readGolden(t, m) {
				for _, special := range []bool{false, true} {
					want := c.IDs
					if special {
						want = c.IDsSpecial
					}
					got := tk.Encode(c.Text, special)
					if d := firstDiff(got, want); d >= 0 {
						bad++
						if bad <= 10 {
							t.Errorf("case %d %q (add_special=%v): first difference at id %d: got %v want %v",
								i, trunc(c.Text), special, d, window(got, d), window(want, d))
						}
					}
				}
			}
			if bad > 0 {
				t.Errorf("%d encodings differ", bad)
			}
		})
	}
}

func TestGoldenDecode(t *testing.T) {
	for _, m := range goldenModels(t) {
		t.Run(m, func(t *testing.T) {
			tk := loadModel(t, m)
			bad := 0
			for i, c := range readGolden(t, m) {
				if got := tk.Decode(c.IDs, false); got != c.Decoded {
					bad++
					if bad <= 5 {
						t.Errorf("case %d: decode got %q want %q", i, trunc(got), trunc(c.Decoded))
					}
				}
			}
		})
	}
}

func trunc(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

func window(ids []uint32, at int) []uint32 {
	lo, hi := max(0, at-3), min(len(ids), at+5)
	if lo > hi {
		return nil
	}
	return ids[lo:hi]
}
