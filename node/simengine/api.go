package simengine

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/prefixmesh/prefixmesh/internal/openai"
	"github.com/prefixmesh/prefixmesh/internal/tokenizer"
)

// The request side of the OpenAI-compatible API. Bodies are parsed by internal/openai, the same
// strict, linear-time parser as the router's front door, so both accept exactly the same
// requests. Fields the simulator has no use for (temperature, top_p, stop, seed, user, …) are
// accepted and ignored, as clients send them routinely.

// defaultMaxTokens is OpenAI's default for /v1/completions, used for chat too.
const defaultMaxTokens = 16

// HeaderCachedTokens carries a response's cached_tokens, also for streams without usage.
const HeaderCachedTokens = "X-Prefixmesh-Cached-Tokens"

type tokenizeRequest struct {
	Model    string          `json:"model"`
	Prompt   *string         `json:"prompt"`
	Messages json.RawMessage `json:"messages"`
}

type tokenizeResponse struct {
	Tokens []uint32 `json:"tokens"`
	Count  int      `json:"count"`
}

// genRequest is a validated generation request.
type genRequest struct {
	chat         bool
	model        string // as the client named it, echoed back
	adapter      uint64
	tokens       []uint32
	maxTokens    int
	stream       bool
	includeUsage bool
	kv           *kvParams // kv_transfer_params; nil when absent or without a KV connector
}

func invalid(format string, args ...any) error { return openai.Invalid("", format, args...) }

// resolve validates what the shared parser leaves to the engine and maps the model name and
// adapter_id to an adapter.
func (e *Engine) resolve(f *openai.GenParams, req *genRequest) error {
	req.model = f.Model
	if req.model == "" {
		req.model = e.cfg.Model
	}
	switch {
	case req.model == e.cfg.Model:
	case strings.HasPrefix(req.model, e.cfg.Model+":"):
		id, err := strconv.ParseUint(req.model[len(e.cfg.Model)+1:], 10, 64)
		if err != nil {
			return openai.Invalid("model", "model %q: the adapter after %q must be a decimal id", req.model, e.cfg.Model+":")
		}
		req.adapter = id
	default:
		return &openai.Error{Status: 404, Code: "model_not_found", Param: "model",
			Message: fmt.Sprintf("model %q does not exist; this engine serves %q (or %q)", req.model, e.cfg.Model, e.cfg.Model+":<adapter id>")}
	}
	if f.AdapterID != nil {
		if req.adapter != 0 && req.adapter != *f.AdapterID {
			return openai.Invalid("adapter_id", "adapter_id %d contradicts model %q", *f.AdapterID, req.model)
		}
		req.adapter = *f.AdapterID
	}
	req.maxTokens = f.MaxTokensOr(defaultMaxTokens)
	if f.N != nil && *f.N != 1 {
		return openai.Invalid("n", "n %d: only n = 1 is supported", *f.N)
	}
	req.stream = f.Stream
	req.includeUsage = f.IncludeUsage()
	return nil
}

func (e *Engine) parseCompletion(body []byte) (*genRequest, error) {
	c, err := openai.ParseCompletion(body)
	if err != nil {
		return nil, err
	}
	req := &genRequest{}
	if err := e.resolve(&c.GenParams, req); err != nil {
		return nil, err
	}
	// A batch of several prompts is several sequences; the simulated engine runs one per
	// request (the router's front door splits batches before they reach it).
	if len(c.Prompt.Items) > 1 {
		return nil, openai.Invalid("prompt", "prompt: the simulated engine serves one prompt per request, got a batch of %d; send batches through the router, which splits them", len(c.Prompt.Items))
	}
	it := &c.Prompt.Items[0]
	if it.IsText() {
		if req.tokens, err = e.encodePrompt(it.Text); err != nil {
			return nil, err
		}
	} else {
		req.tokens = it.IDs
	}
	return req, nil
}

func (e *Engine) parseChat(body []byte) (*genRequest, error) {
	c, err := openai.ParseChat(body)
	if err != nil {
		return nil, err
	}
	req := &genRequest{chat: true}
	if err := e.resolve(&c.GenParams, req); err != nil {
		return nil, err
	}
	toks, err := e.encodeChat(body, c.Messages)
	if err != nil {
		return nil, err
	}
	req.tokens = toks
	return req, nil
}

// encodePrompt and encodeChat are internal/tokenizer's EncodePrompt and EncodeChat, the same
// calls the router makes, with their errors as 400s.
func (e *Engine) encodePrompt(text string) ([]uint32, error) {
	toks, err := tokenizer.EncodePrompt(context.Background(), e.tok, text)
	if err != nil {
		return nil, openai.Invalid("prompt", "tokenize the prompt: %v", err)
	}
	return toks, nil
}

func (e *Engine) encodeChat(body []byte, msgs []tokenizer.ChatMessage) ([]uint32, error) {
	toks, err := tokenizer.EncodeChat(context.Background(), e.tok, body, msgs)
	if err != nil {
		return nil, openai.Invalid("messages", "render the chat: %v", err)
	}
	return toks, nil
}

func (e *Engine) parseTokenize(body []byte) ([]uint32, error) {
	var r tokenizeRequest
	if err := openai.Decode(body, &r); err != nil {
		return nil, err
	}
	switch {
	case r.Prompt != nil && r.Messages != nil:
		return nil, invalid("give either \"prompt\" or \"messages\", not both")
	case r.Prompt != nil:
		return e.encodePrompt(*r.Prompt)
	case r.Messages != nil:
		msgs, err := openai.ParseMessages(r.Messages)
		if err != nil {
			return nil, err
		}
		return e.encodeChat(body, msgs)
	}
	return nil, openai.Invalid("prompt", "field \"prompt\" (text) or \"messages\" is required")
}
