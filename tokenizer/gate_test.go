package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
)

// tinyByteLevel is a minimal byte-level BPE tokenizer.json: the 256-character alphabet, merges
// "a b" → "ab" and "ab c" → "abc", and one special token.
func tinyByteLevel() map[string]any {
	vocab := map[string]any{}
	for b := 0; b < 256; b++ {
		vocab[string(byteToRune[b])] = b
	}
	vocab["ab"] = 256
	vocab["abc"] = 257
	return map[string]any{
		"version": "1.0", "truncation": nil, "padding": nil,
		"added_tokens":   []any{map[string]any{"id": 258, "content": "<|end|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}},
		"normalizer":     nil,
		"pre_tokenizer":  map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
		"post_processor": nil, "decoder": map[string]any{"type": "ByteLevel"},
		"model": map[string]any{"type": "BPE", "dropout": nil, "unk_token": nil, "fuse_unk": false, "byte_fallback": false,
			"ignore_merges": false, "vocab": vocab, "merges": []any{"a b", "ab c"}},
	}
}

func loadMap(t *testing.T, m map[string]any, cfg string) (*Tokenizer, error) {
	t.Helper()
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return Load(b, []byte(cfg))
}

func TestTiny(t *testing.T) {
	tk, err := loadMap(t, tinyByteLevel(), "")
	if err != nil {
		t.Fatal(err)
	}
	got := tk.Encode("abc abx<|end|>", true)
	want := []uint32{257, ' ', 256, 'x', 258}
	if firstDiff(got, want) >= 0 {
		t.Fatalf("got %v want %v", got, want)
	}
	if s := tk.Decode(got, false); s != "abc abx<|end|>" {
		t.Fatalf("decode %q", s)
	}
	if s := tk.Decode(got, true); s != "abc abx" {
		t.Fatalf("decode skipping specials %q", s)
	}
}

func TestUnsupportedIsRefusedByName(t *testing.T) {
	cases := []struct {
		name    string
		edit    func(m map[string]any)
		feature string
	}{
		{"wordpiece", func(m map[string]any) { m["model"].(map[string]any)["type"] = "WordPiece" }, `model "WordPiece"`},
		{"unigram", func(m map[string]any) { m["model"].(map[string]any)["type"] = "Unigram" }, `model "Unigram"`},
		{"dropout", func(m map[string]any) { m["model"].(map[string]any)["dropout"] = 0.1 }, "dropout"},
		{"lowercase", func(m map[string]any) { m["normalizer"] = map[string]any{"type": "Lowercase"} }, `normalizer "Lowercase"`},
		{"nested", func(m map[string]any) {
			m["normalizer"] = map[string]any{"type": "Sequence", "normalizers": []any{map[string]any{"type": "NFC"}, map[string]any{"type": "NFKD"}}}
		}, `normalizer "NFKD"`},
		{"whitespace", func(m map[string]any) { m["pre_tokenizer"] = map[string]any{"type": "Whitespace"} }, `pre_tokenizer "Whitespace"`},
		{"bert", func(m map[string]any) { m["post_processor"] = map[string]any{"type": "BertProcessing"} }, `post_processor "BertProcessing"`},
		{"truncation", func(m map[string]any) { m["truncation"] = map[string]any{"max_length": 8} }, "truncation"},
		{"padding", func(m map[string]any) { m["padding"] = map[string]any{"strategy": "BatchLongest"} }, "padding"},
		{"behavior", func(m map[string]any) {
			m["pre_tokenizer"] = map[string]any{"type": "Sequence", "pretokenizers": []any{
				map[string]any{"type": "Split", "pattern": map[string]any{"String": " "}, "behavior": "Sideways", "invert": false},
				map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}}}
		}, `split behavior "Sideways"`},
		{"regex", func(m map[string]any) {
			m["pre_tokenizer"] = map[string]any{"type": "Sequence", "pretokenizers": []any{
				map[string]any{"type": "Split", "pattern": map[string]any{"Regex": "(?<=a"}, "behavior": "Isolated", "invert": false},
				map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}}}
		}, "regex"},
		{"bytelevel-not-last", func(m map[string]any) {
			m["pre_tokenizer"] = map[string]any{"type": "Sequence", "pretokenizers": []any{
				map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false},
				map[string]any{"type": "Split", "pattern": map[string]any{"String": " "}, "behavior": "Isolated", "invert": false}}}
		}, "ByteLevel pre-tokenizer before"},
		{"decoder", func(m map[string]any) { m["decoder"] = map[string]any{"type": "WordPiece"} }, `decoder "WordPiece"`},
		{"unknown-field", func(m map[string]any) { m["pre_tokenizer"].(map[string]any)["split_digits"] = true }, "pre_tokenizer/ByteLevel field split_digits"},
		{"unknown-model-field", func(m map[string]any) { m["model"].(map[string]any)["merge_policy"] = "x" }, "model/BPE field merge_policy"},
		{"unknown-top-level", func(m map[string]any) { m["new_stage"] = map[string]any{} }, "file field new_stage"},
		{"unknown-added-flag", func(m map[string]any) {
			m["added_tokens"].([]any)[0].(map[string]any)["strip_accents"] = true
		}, "added_token field strip_accents"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := tinyByteLevel()
			c.edit(m)
			_, err := loadMap(t, m, "")
			if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), c.feature) {
				t.Fatalf("got %v, want ErrUnsupported naming %q", err, c.feature)
			}
		})
	}
}

func TestConfigOverride(t *testing.T) {
	m := tinyByteLevel()
	m["added_tokens"] = append(m["added_tokens"].([]any),
		map[string]any{"id": 259, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true})
	tk, err := loadMap(t, m, `{"add_bos_token": true, "add_eos_token": true, "bos_token": {"content": "<s>"}, "eos_token": "<|end|>"}`)
	if err != nil {
		t.Fatal(err)
	}
	if got := tk.Encode("ab", true); firstDiff(got, []uint32{259, 256, 258}) >= 0 {
		t.Fatalf("with special tokens: %v", got)
	}
	if got := tk.Encode("ab", false); firstDiff(got, []uint32{256}) >= 0 {
		t.Fatalf("without: %v", got)
	}
	if _, err := loadMap(t, tinyByteLevel(), `{"add_bos_token": true, "bos_token": "<missing>"}`); err == nil {
		t.Fatal("a BOS that is not a token was accepted")
	}
}

func TestInvalidUTF8IsRepaired(t *testing.T) {
	tk, err := loadMap(t, tinyByteLevel(), "")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := tk.Encode("a\xffb", false), tk.Encode("a\uFFFDb", false); firstDiff(got, want) >= 0 {
		t.Fatalf("got %v want %v", got, want)
	}
}

// TestSegmentCacheExact: encoding with the segment cache (cold and warm) gives the ids of
// encoding without it, on long chats whose turns share segments.
func TestSegmentCacheExact(t *testing.T) {
	for _, m := range []string{"llama3_1", "qwen3", "llama2_ms_first"} {
		t.Run(m, func(t *testing.T) {
			tk := loadModel(t, m)
			cold := *tk
			cold.segs = newSegmentCache(0)
			cold.words = newWordCache()
			cases := readGolden(t, m)
			var sb strings.Builder
			for i, c := range cases {
				sb.WriteString(c.Text)
				if i%3 == 0 {
					sb.WriteString("<|im_end|><|eot_id|></s>")
				}
				if i%8 != 0 && i != len(cases)-1 {
					continue
				}
				text := sb.String()
				want := cold.Encode(text, false)
				for pass := 0; pass < 2; pass++ {
					if got := tk.Encode(text, false); firstDiff(got, want) >= 0 {
						t.Fatalf("prefix %d pass %d: cached ids differ at %d", i, pass, firstDiff(got, want))
					}
				}
			}
		})
	}
}

func FuzzEncode(f *testing.F) {
	for _, s := range []string{"", "Hello, world!", "<|end|>ab", "\xff\xfe", "  \r\n\t", "abcabc<|end|"} {
		f.Add(s)
	}
	m := tinyByteLevel()
	b, _ := json.Marshal(m)
	tk, err := Load(b, nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ids := tk.Encode(s, true)
		if len(s) > 0 && len(ids) == 0 {
			t.Fatalf("no ids for %q", s)
		}
		if got := tk.Decode(ids, false); strings.ToValidUTF8(s, "\uFFFD") != got {
			t.Fatalf("round trip %q → %q", s, got)
		}
	})
}

// TestConcurrentEncode: goroutines sharing one tokenizer (and its caches) get the golden ids.
func TestConcurrentEncode(t *testing.T) {
	tk := loadModel(t, "qwen3")
	cases := readGolden(t, "qwen3")
	var wg sync.WaitGroup
	errs := make(chan string, 4)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := g; i < len(cases); i += 2 {
				if d := firstDiff(tk.Encode(cases[i].Text, false), cases[i].IDs); d >= 0 {
					errs <- fmt.Sprintf("goroutine %d case %d: differs at %d", g, i, d)
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

// TestMetaSplitEqualsWhole: cutting SentencePiece words at safe ▁ boundaries (splitMeta) gives
// the ids of merging whole words, on the corpus and on random mixes of its pieces.
func TestMetaSplitEqualsWhole(t *testing.T) {
	for _, m := range []string{"llama2", "gemma3", "llama2_ms_first"} {
		t.Run(m, func(t *testing.T) {
			tk := loadModel(t, m)
			if !tk.model.splitMeta {
				t.Fatalf("%s: splitMeta is off", m)
			}
			whole := *tk
			wm := *tk.model
			wm.splitMeta = false
			whole.model = &wm
			whole.words = newWordCache()
			whole.segs = newSegmentCache(0)
			cases := readGolden(t, m)
			texts := []string{"<p> </p> x> </y", "a > </ b", strings.Repeat("> </ ", 200), "\n> </\t"}
			for _, c := range cases {
				texts = append(texts, c.Text)
			}
			seed := uint32(12)
			for i := 0; i < len(cases); i++ {
				var sb strings.Builder
				for j := 0; j < 6; j++ {
					seed = seed*1664525 + 1013904223
					sb.WriteString(cases[seed%uint32(len(cases))].Text)
					sb.WriteString(strings.Repeat(" ", int(seed>>28)))
				}
				texts = append(texts, sb.String())
			}
			for i, s := range texts {
				if d := firstDiff(tk.Encode(s, false), whole.Encode(s, false)); d >= 0 {
					t.Fatalf("text %d: split and whole differ at id %d", i, d)
				}
			}
		})
	}
}
