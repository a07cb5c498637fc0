package simengine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/prefixmesh/prefixmesh/internal/tokenizer"
)

// The OpenAI-compatible wire types. Fields the simulator has no use for (temperature, top_p,
// stop, seed, user, …) are accepted and ignored, as clients send them routinely.

// defaultMaxTokens is OpenAI's default for /v1/completions, used for chat too.
const defaultMaxTokens = 16

// HeaderCachedTokens carries a response's cached_tokens, also for streams without usage.
const HeaderCachedTokens = "X-Prefixmesh-Cached-Tokens"

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// genFields are the fields completions and chat share.
type genFields struct {
	Model               string         `json:"model"`
	MaxTokens           *int           `json:"max_tokens"`
	MaxCompletionTokens *int           `json:"max_completion_tokens"`
	Stream              bool           `json:"stream"`
	StreamOptions       *streamOptions `json:"stream_options"`
	N                   *int           `json:"n"`
	// AdapterID selects a LoRA adapter by its numeric id (0 = base model), the id the prefix
	// cache is keyed by. Equivalent to model "<Model>:<id>".
	AdapterID *uint64 `json:"adapter_id"`
}

type completionRequest struct {
	genFields
	Prompt json.RawMessage `json:"prompt"`
}

type chatRequest struct {
	genFields
	Messages []tokenizer.ChatMessage `json:"messages"`
}

type tokenizeRequest struct {
	Model    string                  `json:"model"`
	Prompt   *string                 `json:"prompt"`
	Messages []tokenizer.ChatMessage `json:"messages"`
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
}

// badRequest is a client error; its message names the problem.
type badRequest struct {
	status int
	code   string
	msg    string
}

func (b *badRequest) Error() string { return b.msg }

func invalid(format string, args ...any) error {
	return &badRequest{status: 400, code: "invalid_request", msg: fmt.Sprintf(format, args...)}
}

// decodeJSON unmarshals body into v, naming the offending field on a type error.
func decodeJSON(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return invalid("field %q: expected %s, got JSON %s", te.Field, te.Type, te.Value)
		}
		if errors.As(err, &te) {
			return invalid("request body: expected a JSON object, got JSON %s", te.Value)
		}
		return invalid("invalid JSON: %v", err)
	}
	if dec.More() {
		return invalid("invalid JSON: trailing data after the request object")
	}
	return nil
}

// resolve validates the shared fields and maps the model name and adapter_id to an adapter.
func (e *Engine) resolve(f *genFields, req *genRequest) error {
	req.model = f.Model
	if req.model == "" {
		req.model = e.cfg.Model
	}
	switch {
	case req.model == e.cfg.Model:
	case strings.HasPrefix(req.model, e.cfg.Model+":"):
		id, err := strconv.ParseUint(req.model[len(e.cfg.Model)+1:], 10, 64)
		if err != nil {
			return invalid("model %q: the adapter after %q must be a decimal id", req.model, e.cfg.Model+":")
		}
		req.adapter = id
	default:
		return &badRequest{status: 404, code: "model_not_found",
			msg: fmt.Sprintf("model %q does not exist; this engine serves %q (or %q)", req.model, e.cfg.Model, e.cfg.Model+":<adapter id>")}
	}
	if f.AdapterID != nil {
		if req.adapter != 0 && req.adapter != *f.AdapterID {
			return invalid("adapter_id %d contradicts model %q", *f.AdapterID, req.model)
		}
		req.adapter = *f.AdapterID
	}
	req.maxTokens = defaultMaxTokens
	switch {
	case f.MaxCompletionTokens != nil:
		req.maxTokens = *f.MaxCompletionTokens
		if f.MaxTokens != nil && *f.MaxTokens != *f.MaxCompletionTokens {
			return invalid("max_tokens and max_completion_tokens differ")
		}
	case f.MaxTokens != nil:
		req.maxTokens = *f.MaxTokens
	}
	if req.maxTokens < 0 {
		return invalid("max_tokens %d must not be negative", req.maxTokens)
	}
	if f.N != nil && *f.N != 1 {
		return invalid("n %d: only n = 1 is supported", *f.N)
	}
	req.stream = f.Stream
	req.includeUsage = f.StreamOptions != nil && f.StreamOptions.IncludeUsage
	if f.StreamOptions != nil && !f.Stream {
		return invalid("stream_options is only allowed with stream: true")
	}
	return nil
}

func (e *Engine) parseCompletion(body []byte) (*genRequest, error) {
	var r completionRequest
	if err := decodeJSON(body, &r); err != nil {
		return nil, err
	}
	req := &genRequest{}
	if err := e.resolve(&r.genFields, req); err != nil {
		return nil, err
	}
	toks, err := e.promptTokens(r.Prompt)
	if err != nil {
		return nil, err
	}
	req.tokens = toks
	return req, nil
}

// promptTokens accepts a string (tokenised), an array of token ids (used as is), or a
// one-element array of either. Batches of several prompts are not supported.
func (e *Engine) promptTokens(raw json.RawMessage) ([]uint32, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, invalid("field \"prompt\" is required")
	}
	var text string
	if err := json.Unmarshal(raw, &text); err == nil {
		if text == "" {
			return nil, invalid("field \"prompt\" is empty")
		}
		return e.encodePrompt(text)
	}
	var ids []float64
	if err := json.Unmarshal(raw, &ids); err == nil {
		if len(ids) == 0 {
			return nil, invalid("field \"prompt\" is empty")
		}
		out := make([]uint32, len(ids))
		for i, f := range ids {
			if f < 0 || f > math.MaxUint32 || f != math.Trunc(f) {
				return nil, invalid("prompt[%d] = %v is not a token id (an integer in 0..%d)", i, f, uint32(math.MaxUint32))
			}
			out[i] = uint32(f)
		}
		return out, nil
	}
	var batch []json.RawMessage
	if err := json.Unmarshal(raw, &batch); err == nil && len(batch) == 1 {
		return e.promptTokens(batch[0])
	} else if err == nil && len(batch) > 1 {
		return nil, invalid("field \"prompt\": batches of %d prompts are not supported; send one per request", len(batch))
	}
	return nil, invalid("field \"prompt\" must be a string or an array of token ids")
}

func (e *Engine) parseChat(body []byte) (*genRequest, error) {
	var r chatRequest
	if err := decodeJSON(body, &r); err != nil {
		return nil, err
	}
	req := &genRequest{chat: true}
	if err := e.resolve(&r.genFields, req); err != nil {
		return nil, err
	}
	if err := checkMessages(r.Messages); err != nil {
		return nil, err
	}
	toks, err := e.encodeChat(body, r.Messages)
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
		return nil, invalid("tokenize the prompt: %v", err)
	}
	return toks, nil
}

func (e *Engine) encodeChat(body []byte, msgs []tokenizer.ChatMessage) ([]uint32, error) {
	toks, err := tokenizer.EncodeChat(context.Background(), e.tok, body, msgs)
	if err != nil {
		return nil, invalid("render the chat: %v", err)
	}
	return toks, nil
}

func checkMessages(msgs []tokenizer.ChatMessage) error {
	if len(msgs) == 0 {
		return invalid("field \"messages\" is required and must not be empty")
	}
	for i, m := range msgs {
		if m.Role == "" || strings.ContainsAny(m.Role, "|<>\n") {
			return invalid("messages[%d].role %q must be a non-empty name without '|', '<', '>' or newlines", i, m.Role)
		}
	}
	return nil
}

func (e *Engine) parseTokenize(body []byte) ([]uint32, error) {
	var r tokenizeRequest
	if err := decodeJSON(body, &r); err != nil {
		return nil, err
	}
	switch {
	case r.Prompt != nil && r.Messages != nil:
		return nil, invalid("give either \"prompt\" or \"messages\", not both")
	case r.Prompt != nil:
		return e.encodePrompt(*r.Prompt)
	case r.Messages != nil:
		if err := checkMessages(r.Messages); err != nil {
			return nil, err
		}
		return e.encodeChat(body, r.Messages)
	}
	return nil, invalid("field \"prompt\" (text) or \"messages\" is required")
}
