// Package tokenizer turns text into the token ids that prefix caching is keyed by, with one
// deterministic implementation shared by the simulated engine and the router, so that both compute
// the same block hashes from the same prompt. A spec names the tokenizer: "cl100k_base", the
// byte-pair encoding of github.com/tiktoken-go/tokenizer (its vocabulary is embedded in the binary,
// so it works offline); "bytes", one token per UTF-8 byte, trivial and fast, for tests (chat
// requests for these two are rendered by RenderChat, the single home-made template both sides
// use); "hf:DIR", a real model's tokenizer.json and chat template, exact in Go (package
// github.com/prefixmesh/prefixmesh/tokenizer); "render:URL", a vLLM render server asked per
// request. EncodePrompt and EncodeChat are the one way both sides turn a request into ids.
package tokenizer

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	tiktoken "github.com/tiktoken-go/tokenizer"
)

// Names of the supported tokenizers.
const (
	CL100kBase = "cl100k_base"
	Bytes      = "bytes"
)

// ErrUnknownTokenizer is returned by New for a name it does not know.
var ErrUnknownTokenizer = errors.New("unknown tokenizer")

// Tokenizer encodes text into token ids and back. Implementations are deterministic and safe for
// concurrent use.
type Tokenizer interface {
	// Name is the name New was given.
	Name() string
	// Encode returns the token ids of text; the empty string has none.
	Encode(text string) []uint32
	// Decode returns the text of ids. Ids the vocabulary does not know, and byte sequences that
	// are not valid UTF-8, decode to U+FFFD, so the result is always valid UTF-8.
	Decode(ids []uint32) string
}

// New returns the tokenizer a spec names: CL100kBase or Bytes (embedded), "hf:DIR" (a model's
// Hugging Face tokenizer files, exact in Go; loaded once per directory) or "render:URL" (a vLLM
// render server or an engine's /tokenize).
func New(name string) (Tokenizer, error) {
	switch {
	case strings.HasPrefix(name, HFPrefix):
		return newHF(name)
	case strings.HasPrefix(name, RenderPrefix):
		return newRender(name)
	}
	switch name {
	case CL100kBase:
		c, err := tiktoken.Get(tiktoken.Cl100kBase)
		if err != nil {
			return nil, fmt.Errorf("load %s: %w", name, err)
		}
		// Replace invalid UTF-8 (as Python tiktoken does by default) so Decode always returns
		// valid UTF-8 and Encode treats any input deterministically. Set before sharing.
		c.SetErrorMode(tiktoken.ErrorModeReplace)
		return &bpe{codec: c}, nil
	case Bytes:
		return byteTokenizer{}, nil
	}
	return nil, fmt.Errorf("%w %q (want %q, %q, %sDIR or %sURL)", ErrUnknownTokenizer, name, CL100kBase, Bytes, HFPrefix, RenderPrefix)
}

// bpe adapts a tiktoken codec. Special tokens (<|endoftext|> …) are encoded as ordinary text:
// user input must never be able to inject them.
type bpe struct {
	codec tiktoken.Codec
}

func (b *bpe) Name() string { return CL100kBase }

func (b *bpe) Encode(text string) []uint32 {
	if text == "" {
		return nil
	}
	ids, _, err := b.codec.Encode(text)
	if err != nil {
		// Only the strict error mode or a regexp timeout fails, and neither is configured; fall
		// back to bytes' ids rather than dropping the prompt, so the result stays deterministic.
		return byteTokenizer{}.Encode(text)
	}
	out := make([]uint32, len(ids))
	for i, id := range ids {
		out[i] = uint32(id)
	}
	return out
}

func (b *bpe) Decode(ids []uint32) string {
	if len(ids) == 0 {
		return ""
	}
	u := make([]uint, len(ids))
	for i, id := range ids {
		u[i] = uint(id)
	}
	if s, err := b.codec.Decode(u); err == nil {
		return s
	}
	// Some id is unknown: decode the known runs and put U+FFFD for each unknown id.
	var sb strings.Builder
	start := 0
	flush := func(end int) {
		if end > start {
			s, _ := b.codec.Decode(u[start:end])
			sb.WriteString(s)
		}
	}
	for i := range u {
		if _, err := b.codec.Decode(u[i : i+1]); err != nil {
			flush(i)
			sb.WriteRune(utf8.RuneError)
			start = i + 1
		}
	}
	flush(len(u))
	return sb.String()
}

// byteTokenizer maps each UTF-8 byte to the token id of its value (0–255).
type byteTokenizer struct{}

func (byteTokenizer) Name() string { return Bytes }

func (byteTokenizer) Encode(text string) []uint32 {
	if text == "" {
		return nil
	}
	out := make([]uint32, len(text))
	for i := 0; i < len(text); i++ {
		out[i] = uint32(text[i])
	}
	return out
}

func (byteTokenizer) Decode(ids []uint32) string {
	buf := make([]byte, 0, len(ids))
	valid := true
	for _, id := range ids {
		if id > 0xFF {
			// Not a byte: U+FFFD, encoded, so the result stays valid UTF-8.
			buf = utf8.AppendRune(buf, utf8.RuneError)
			continue
		}
		buf = append(buf, byte(id))
		valid = valid && id < utf8.RuneSelf
	}
	if valid {
		return string(buf)
	}
	return strings.ToValidUTF8(string(buf), string(utf8.RuneError))
}
