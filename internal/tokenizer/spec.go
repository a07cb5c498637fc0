package tokenizer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	hf "github.com/prefixmesh/prefixmesh/tokenizer"
	"github.com/prefixmesh/prefixmesh/tokenizer/chat"
)

// Spec prefixes beside the embedded vocabulary names.
const (
	// HFPrefix names a directory holding a model's tokenizer.json (and tokenizer_config.json):
	// "hf:/models/Llama-3.1-8B-Instruct". Encoded exactly in Go (package tokenizer).
	HFPrefix = "hf:"
	// RenderPrefix names a vLLM render server (or an engine's /tokenize): "render:http://…".
	RenderPrefix = "render:"
)

// Errors of the prompt and chat paths.
var (
	// ErrBadChat wraps a chat request the template cannot render (the client's fault: 400).
	ErrBadChat = chat.ErrBadRequest
	// ErrInexact wraps a request or file that cannot be tokenized exactly in Go (a template
	// feature, a number the template formats the Go way): nothing approximate is returned.
	// InexactReason names the cause.
	ErrInexact = hf.ErrUnsupported
)

// PromptEncoder is implemented by tokenizers whose completion prompts get special tokens (a
// BOS) the way vLLM's completions path adds them (add_special_tokens=True).
type PromptEncoder interface {
	EncodePrompt(ctx context.Context, text string) ([]uint32, error)
}

// ChatEncoder is implemented by tokenizers that render chat requests with the model's own
// template; body is the raw /v1/chat/completions JSON.
type ChatEncoder interface {
	EncodeChat(ctx context.Context, body []byte) ([]uint32, error)
}

// EncodePrompt returns the ids of a completion's text prompt: with the model's special tokens
// for tokenizers that have them, else Encode(text).
func EncodePrompt(ctx context.Context, tok Tokenizer, text string) ([]uint32, error) {
	if pe, ok := tok.(PromptEncoder); ok {
		return pe.EncodePrompt(ctx, text)
	}
	return tok.Encode(text), nil
}

// EncodeChat returns the ids of a chat request: rendered by the model's template for
// tokenizers that have one (body is the raw request), else RenderChat(msgs) encoded.
func EncodeChat(ctx context.Context, tok Tokenizer, body []byte, msgs []ChatMessage) ([]uint32, error) {
	if ce, ok := tok.(ChatEncoder); ok {
		return ce.EncodeChat(ctx, body)
	}
	return tok.Encode(RenderChat(msgs)), nil
}

// hfTokenizers caches loaded directories: loading parses a ~10 MB file, and config validation
// and the server both call New with the same spec; one instance also shares its segment cache.
var hfTokenizers sync.Map // dir → *HF

// HF is a Hugging Face tokenizer directory, encoded exactly in Go.
type HF struct {
	name string
	tok  *hf.Tokenizer
	chat *chat.Template // nil if the files have no chat template (or one Go cannot render)
	// chatErr says why chat is nil.
	chatErr error
}

func newHF(spec string) (*HF, error) {
	dir := strings.TrimPrefix(spec, HFPrefix)
	if dir == "" {
		return nil, fmt.Errorf("%w %q: %s needs a directory", ErrUnknownTokenizer, spec, HFPrefix)
	}
	if t, ok := hfTokenizers.Load(dir); ok {
		return t.(*HF), nil
	}
	tok, err := hf.LoadDir(dir)
	if err != nil {
		return nil, err
	}
	h := &HF{name: spec, tok: tok}
	if h.chat, err = chat.New(tok); err != nil {
		h.chatErr = err
	}
	t, _ := hfTokenizers.LoadOrStore(dir, h)
	return t.(*HF), nil
}

// Name is the spec New was given.
func (h *HF) Name() string { return h.name }

// Encode returns the ids of text without special tokens (what Decode inverts).
func (h *HF) Encode(text string) []uint32 { return h.tok.Encode(text, false) }

// Decode returns the text of ids; an id the vocabulary does not know decodes to U+FFFD.
func (h *HF) Decode(ids []uint32) string {
	var sb strings.Builder
	start := 0
	for i, id := range ids {
		if !h.tok.Known(id) {
			sb.WriteString(h.tok.Decode(ids[start:i], false))
			sb.WriteRune('\uFFFD')
			start = i + 1
		}
	}
	sb.WriteString(h.tok.Decode(ids[start:], false))
	return sb.String()
}

// EncodePrompt encodes a completion prompt with add_special_tokens on, as vLLM does.
func (h *HF) EncodePrompt(_ context.Context, text string) ([]uint32, error) {
	return h.tok.Encode(text, true), nil
}

// EncodeChat renders and encodes a chat request as vLLM does.
func (h *HF) EncodeChat(_ context.Context, body []byte) ([]uint32, error) {
	if h.chat == nil {
		if errors.Is(h.chatErr, ErrInexact) { // chat.New's errors already say "unsupported …"
			return nil, fmt.Errorf("%s: %w", h.name, h.chatErr)
		}
		return nil, fmt.Errorf("%w: %s: %v", ErrInexact, h.name, h.chatErr)
	}
	return h.chat.EncodeBody(body)
}

// Tokenizer returns the underlying exact tokenizer.
func (h *HF) Tokenizer() *hf.Tokenizer { return h.tok }

// IsInexact reports whether err means "cannot be tokenized exactly here" (not a client error).
func IsInexact(err error) bool {
	return errors.Is(err, ErrInexact)
}

// InexactReason names why err refuses exact tokenization, for metrics (docs/tokenization.md
// lists the reasons): no_chat_template, template_feature, number_format, big_integer,
// python_whitespace, python_repr, tokenizer_feature; "" if err is not such a refusal.
func InexactReason(err error) string { return chat.Reason(err) }
