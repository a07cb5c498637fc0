package tokenizer

import (
	"encoding/json"
	"sort"
	"strings"
)

// knownKeys lists, per component, the fields whose meaning this package implements. A field
// outside the list is refused at load (a newer tokenizers release may add options that change
// ids; guessing would tokenize approximately).
var knownKeys = map[string][]string{
	"file":                    {"version", "truncation", "padding", "added_tokens", "normalizer", "pre_tokenizer", "post_processor", "decoder", "model"},
	"added_token":             {"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special"},
	"pattern":                 {"String", "Regex"},
	"model/BPE":               {"type", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", "byte_fallback", "ignore_merges", "vocab", "merges"},
	"normalizer/NFC":          {"type"},
	"normalizer/Prepend":      {"type", "prepend"},
	"normalizer/Replace":      {"type", "pattern", "content"},
	"normalizer/Sequence":     {"type", "normalizers"},
	"pre_tokenizer/Sequence":  {"type", "pretokenizers"},
	"pre_tokenizer/Split":     {"type", "pattern", "behavior", "invert"},
	"pre_tokenizer/ByteLevel": {"type", "add_prefix_space", "trim_offsets", "use_regex"},
	"pre_tokenizer/Metaspace": {"type", "replacement", "prepend_scheme", "split", "add_prefix_space", "str_rep"},
	// trim_offsets and add_prefix_space of the ByteLevel post-processor only move offsets.
	"post_processor/ByteLevel":          {"type", "add_prefix_space", "trim_offsets", "use_regex"},
	"post_processor/TemplateProcessing": {"type", "single", "pair", "special_tokens"},
	"post_processor/Sequence":           {"type", "processors"},
}

// checkKeys refuses fields of raw (a JSON object) that knownKeys[kind] does not list.
func checkKeys(raw json.RawMessage, kind string) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return err
	}
	allowed := knownKeys[kind]
	var unknown []string
	for k := range m {
		ok := false
		for _, a := range allowed {
			if k == a {
				ok = true
				break
			}
		}
		if !ok {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return unsupported("%s field %s", kind, strings.Join(unknown, ", "))
	}
	return nil
}
