package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// ErrUnsupported is returned (wrapped, naming the feature) for a tokenizer file that uses
// something this package does not implement exactly.
var ErrUnsupported = errors.New("unsupported tokenizer feature")

// maxTokenizerFileBytes bounds tokenizer.json: the largest real ones (Gemma's 256k vocabulary)
// are ~35 MB; 128 MiB leaves room without reading an arbitrary file whole.
const maxTokenizerFileBytes = 128 << 20

func unsupported(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrUnsupported, fmt.Sprintf(format, a...))
}

// parseSequence reads the members of a "Sequence" component, listed under key, with parse,
// naming the member at fault; members that parse to nothing (nil) are left out.
func parseSequence[T comparable](raw json.RawMessage, key string, parse func(json.RawMessage) (T, error)) ([]T, error) {
	var p map[string]json.RawMessage
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, err
	}
	var members []json.RawMessage
	if m, ok := p[key]; ok {
		if err := json.Unmarshal(m, &members); err != nil {
			return nil, err
		}
	}
	var out, zero = []T(nil), *new(T)
	for i, c := range members {
		m, err := parse(c)
		if err != nil {
			return nil, fmt.Errorf("Sequence[%d]: %w", i, err)
		}
		if m != zero {
			out = append(out, m)
		}
	}
	return out, nil
}

// fileJSON is tokenizer.json; components stay raw until their "type" is known.
type fileJSON struct {
	Version       string            `json:"version"`
	Truncation    json.RawMessage   `json:"truncation"`
	Padding       json.RawMessage   `json:"padding"`
	AddedTokens   []json.RawMessage `json:"added_tokens"`
	Normalizer    json.RawMessage   `json:"normalizer"`
	PreTokenizer  json.RawMessage   `json:"pre_tokenizer"`
	PostProcessor json.RawMessage   `json:"post_processor"`
	Decoder       json.RawMessage   `json:"decoder"`
	Model         json.RawMessage   `json:"model"`
}

type addedTokenJSON struct {
	ID         uint32 `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// configJSON is the part of tokenizer_config.json that changes ids.
type configJSON struct {
	AddBOS              *bool           `json:"add_bos_token"`
	AddEOS              *bool           `json:"add_eos_token"`
	BOS                 json.RawMessage `json:"bos_token"`
	EOS                 json.RawMessage `json:"eos_token"`
	UNK                 json.RawMessage `json:"unk_token"`
	PAD                 json.RawMessage `json:"pad_token"`
	ChatTemplate        json.RawMessage `json:"chat_template"`
	SplitSpecialTokens  bool            `json:"split_special_tokens"`
	TokenizerClass      string          `json:"tokenizer_class"`
	AddedTokensDecoder  json.RawMessage `json:"added_tokens_decoder"`
	CleanUpTokenization bool            `json:"clean_up_tokenization_spaces"`
}

// tokenString reads a config token: a string, null, or an AddedToken object with "content".
func tokenString(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var o struct {
		Content string `json:"content"`
	}
	if err := json.Unmarshal(raw, &o); err != nil {
		return "", fmt.Errorf("token must be a string or an object with \"content\": %w", err)
	}
	return o.Content, nil
}

// typedKind reads a component's type and refuses fields outside knownKeys[kind/type].
func typedKind(raw json.RawMessage, kind string) (string, error) {
	typ, err := typed(raw)
	if err != nil || typ == "" {
		return typ, err
	}
	if _, ok := knownKeys[kind+"/"+typ]; ok {
		if err := checkKeys(raw, kind+"/"+typ); err != nil {
			return "", err
		}
	}
	return typ, nil
}

// typed reads a component's "type" field ("" for null).
func typed(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", nil
	}
	var t struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(raw, &t); err != nil {
		return "", err
	}
	if t.Type == "" {
		return "", errors.New("component without a \"type\"")
	}
	return t.Type, nil
}

func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || bytes.Equal(raw, []byte("null"))
}

// LoadDir loads dir/tokenizer.json and, if present, dir/tokenizer_config.json and
// dir/chat_template.jinja.
func LoadDir(dir string) (*Tokenizer, error) {
	tj, err := readCapped(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return nil, err
	}
	cj, err := readCapped(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	t, err := Load(tj, cj)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	// Newer repositories keep the template in chat_template.jinja, which transformers prefers
	// to tokenizer_config.json's chat_template.
	jt, err := readCapped(filepath.Join(dir, "chat_template.jinja"))
	switch {
	case err == nil:
		if t.chatTemplate == nil {
			t.chatTemplate = map[string]string{}
		}
		t.chatTemplate["default"] = string(jt)
	case !errors.Is(err, os.ErrNotExist):
		return nil, err
	}
	return t, nil
}

func readCapped(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() > maxTokenizerFileBytes {
		return nil, fmt.Errorf("%s: %d bytes is over the %d-byte cap", path, st.Size(), maxTokenizerFileBytes)
	}
	return os.ReadFile(path)
}

// Load builds a tokenizer from the bytes of tokenizer.json and tokenizer_config.json (config may
// be nil). It refuses, with ErrUnsupported naming the feature, anything not implemented exactly.
func Load(tokenizerJSON, configJSONBytes []byte) (*Tokenizer, error) {
	var f fileJSON
	if err := json.Unmarshal(tokenizerJSON, &f); err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	if err := checkKeys(tokenizerJSON, "file"); err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	var cfg configJSON
	if len(bytes.TrimSpace(configJSONBytes)) > 0 {
		if err := json.Unmarshal(configJSONBytes, &cfg); err != nil {
			return nil, fmt.Errorf("tokenizer_config.json: %w", err)
		}
	}
	if !isNull(f.Truncation) {
		return nil, unsupported("truncation (it cuts the ids; serving engines do not truncate through tokenizer.json)")
	}
	if !isNull(f.Padding) {
		return nil, unsupported("padding")
	}
	t := &Tokenizer{encodeSpecial: cfg.SplitSpecialTokens}
	var err error
	if t.normalizer, err = parseNormalizer(f.Normalizer); err != nil {
		return nil, fmt.Errorf("normalizer: %w", err)
	}
	if t.pre, err = parsePreTokenizer(f.PreTokenizer); err != nil {
		return nil, fmt.Errorf("pre_tokenizer: %w", err)
	}
	byteLevel := t.pre.byteLevel()
	if t.model, err = parseBPE(f.Model, byteLevel); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	if t.decoder, err = parseDecoder(f.Decoder); err != nil {
		return nil, fmt.Errorf("decoder: %w", err)
	}
	added := make([]addedTokenJSON, len(f.AddedTokens))
	for i, raw := range f.AddedTokens {
		if err := checkKeys(raw, "added_token"); err != nil {
			return nil, fmt.Errorf("added_tokens[%d]: %w", i, err)
		}
		if err := json.Unmarshal(raw, &added[i]); err != nil {
			return nil, fmt.Errorf("added_tokens[%d]: %w", i, err)
		}
	}
	if err := t.setAdded(added); err != nil {
		return nil, fmt.Errorf("added_tokens: %w", err)
	}
	if t.post, err = parsePost(f.PostProcessor, t); err != nil {
		return nil, fmt.Errorf("post_processor: %w", err)
	}
	if t.bos, err = tokenString(cfg.BOS); err != nil {
		return nil, fmt.Errorf("tokenizer_config.json bos_token: %w", err)
	}
	if t.eos, err = tokenString(cfg.EOS); err != nil {
		return nil, fmt.Errorf("tokenizer_config.json eos_token: %w", err)
	}
	t.configTokens = map[string]string{}
	for name, raw := range map[string]json.RawMessage{"bos_token": cfg.BOS, "eos_token": cfg.EOS, "unk_token": cfg.UNK, "pad_token": cfg.PAD} {
		v, err := tokenString(raw)
		if err != nil {
			return nil, fmt.Errorf("tokenizer_config.json %s: %w", name, err)
		}
		if v != "" {
			t.configTokens[name] = v
		}
	}
	if err := t.overridePost(cfg.AddBOS, cfg.AddEOS); err != nil {
		return nil, fmt.Errorf("tokenizer_config.json: %w", err)
	}
	if t.chatTemplate, err = parseChatTemplate(cfg.ChatTemplate); err != nil {
		return nil, fmt.Errorf("tokenizer_config.json chat_template: %w", err)
	}
	t.segs = newSegmentCache(SegmentCacheBytes)
	t.words = newWordCache()
	return t, nil
}

// parseChatTemplate reads chat_template: a string, or a list of {name, template} of which
// "default" is the one used without tools (transformers picks "tool_use" when tools are given;
// both are kept).
func parseChatTemplate(raw json.RawMessage) (map[string]string, error) {
	if isNull(raw) {
		return nil, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return map[string]string{"default": s}, nil
	}
	var list []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, fmt.Errorf("want a string or a list of {name, template}: %w", err)
	}
	m := map[string]string{}
	for _, e := range list {
		m[strings.TrimSpace(e.Name)] = e.Template
	}
	return m, nil
}
