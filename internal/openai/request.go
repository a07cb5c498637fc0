package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"reflect"
	"strconv"
	"strings"

	"github.com/prefixmesh/prefixmesh/internal/tokenizer"
)

// StreamOptions is the request's stream_options.
type StreamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// GenParams are the generation fields the router and the engine both act on; every other field
// (temperature, top_p, stop, seed, …) is accepted and left to the engine, as clients send them
// routinely.
type GenParams struct {
	Model               string         `json:"model"`
	MaxTokens           *int           `json:"max_tokens"`
	MaxCompletionTokens *int           `json:"max_completion_tokens"`
	Stream              bool           `json:"stream"`
	StreamOptions       *StreamOptions `json:"stream_options"`
	N                   *int           `json:"n"`
	// AdapterID selects a LoRA adapter by its numeric id (0 = base model), the id the prefix
	// cache is keyed by; equivalent to model "<served model>:<id>".
	AdapterID *uint64 `json:"adapter_id"`
	User      string  `json:"user"`
	SessionID string  `json:"session_id"`
}

// Completion is a parsed POST /v1/completions body.
type Completion struct {
	GenParams
	Prompt Prompt
}

// Chat is a parsed POST /v1/chat/completions body.
type Chat struct {
	GenParams
	Messages []tokenizer.ChatMessage
}

// ParseCompletion parses and validates a completions body in one pass linear in its length: the
// scanner validates the JSON and hands over each member's span; the prompt goes to ParsePrompt,
// the small fields to encoding/json.
func ParseCompletion(body []byte) (*Completion, error) {
	var c Completion
	seen := false
	s := scanner{prompt: &promptParser{}}
	err := s.members(body, func(key string, val []byte) error {
		if key == "prompt" {
			seen = true
			return nil
		}
		_, err := c.GenParams.genField(key, val)
		return err
	})
	if err != nil {
		return nil, err
	}
	if err := c.GenParams.validate(); err != nil {
		return nil, err
	}
	if !seen {
		return nil, Invalid("prompt", "prompt is required")
	}
	c.Prompt = s.parsed
	return &c, nil
}

// ParseChat parses and validates a chat completions body in one pass linear in its length.
func ParseChat(body []byte) (*Chat, error) {
	var c Chat
	var msgs []byte
	var s scanner
	err := s.members(body, func(key string, val []byte) error {
		if key == "messages" {
			msgs = val
			return nil
		}
		_, err := c.GenParams.genField(key, val)
		return err
	})
	if err != nil {
		return nil, err
	}
	if err := c.GenParams.validate(); err != nil {
		return nil, err
	}
	if c.Messages, err = ParseMessages(msgs); err != nil {
		return nil, err
	}
	return &c, nil
}

// validate applies vLLM's rules to the shared fields: max_tokens (or max_completion_tokens,
// which wins when both are set, as in vLLM) is at least 1, and stream_options needs stream.
func (g *GenParams) validate() error {
	for _, f := range []struct {
		name string
		v    *int
	}{{"max_tokens", g.MaxTokens}, {"max_completion_tokens", g.MaxCompletionTokens}} {
		if f.v != nil && *f.v < 1 {
			return Invalid(f.name, "%s must be at least 1, got %d", f.name, *f.v)
		}
	}
	if g.N != nil && *g.N < 1 {
		return Invalid("n", "n must be at least 1, got %d", *g.N)
	}
	if g.StreamOptions != nil && !g.Stream {
		return Invalid("stream_options", "stream_options is only allowed with stream: true")
	}
	return nil
}

// MaxTokensOr returns the requested output length, def when the request names none.
func (g *GenParams) MaxTokensOr(def int) int {
	switch {
	case g.MaxCompletionTokens != nil:
		return *g.MaxCompletionTokens
	case g.MaxTokens != nil:
		return *g.MaxTokens
	}
	return def
}

// IncludeUsage reports stream_options.include_usage.
func (g *GenParams) IncludeUsage() bool {
	return g.StreamOptions != nil && g.StreamOptions.IncludeUsage
}

// ParseMessages parses a chat request's messages (required, non-empty), naming the message at
// fault. Roles are names without '|', '<', '>' or newlines, so that a role cannot forge the chat
// template's markers.
func ParseMessages(raw json.RawMessage) ([]tokenizer.ChatMessage, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, Invalid("messages", "messages is required")
	}
	var parts []json.RawMessage
	if err := json.Unmarshal(raw, &parts); err != nil {
		return nil, Invalid("messages", "messages must be an array of message objects")
	}
	if len(parts) == 0 {
		return nil, Invalid("messages", "messages must not be empty")
	}
	msgs := make([]tokenizer.ChatMessage, len(parts))
	for i, p := range parts {
		param := "messages[" + strconv.Itoa(i) + "]"
		if b := bytes.TrimSpace(p); len(b) == 0 || b[0] != '{' {
			return nil, Invalid(param, "%s must be an object with role and content", param)
		}
		if err := json.Unmarshal(p, &msgs[i]); err != nil {
			var te *json.UnmarshalTypeError
			if errors.As(err, &te) && te.Field != "" {
				return nil, Invalid(param+"."+te.Field, "%s.%s: expected %s, got %s", param, te.Field, jsonType(te.Type), te.Value)
			}
			return nil, Invalid(param+".content", "%s.content: %v", param, err)
		}
		if r := msgs[i].Role; r == "" || strings.ContainsAny(r, "|<>\n") {
			return nil, Invalid(param+".role", "%s.role %q must be a non-empty name without '|', '<', '>' or newlines", param, r)
		}
	}
	return msgs, nil
}

// Decode unmarshals a JSON object body into v (encoding/json: one linear pass, nesting capped at
// 10,000 levels) and reports errors in the request's terms: the field at fault and JSON type
// names, never Go types.
func Decode(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	err := dec.Decode(v)
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case err == nil:
	case errors.Is(err, io.EOF):
		return Invalid("", "the request body is empty; send a JSON object")
	case errors.As(err, &te) && jsonField(te.Field) != "":
		f := jsonField(te.Field)
		return Invalid(f, "%s: expected %s, got %s", f, jsonType(te.Type), te.Value)
	case errors.As(err, &te):
		return Invalid("", "the request body must be a JSON object, got %s", te.Value)
	case errors.As(err, &se):
		return Invalid("", "invalid JSON at byte %d: %s", se.Offset, strings.TrimPrefix(se.Error(), "invalid character "))
	default:
		return Invalid("", "invalid JSON: %v", err)
	}
	if dec.More() {
		return Invalid("", "invalid JSON: trailing data after the request object")
	}
	if bytes.Equal(bytes.TrimSpace(body), []byte("null")) {
		return Invalid("", "the request body must be a JSON object, got null")
	}
	return nil
}

// jsonField drops the Go names of embedded structs (GenParams.max_tokens) from a field path:
// the wire's field names are lower case, Go's exported names are not.
func jsonField(path string) string {
	parts := strings.Split(path, ".")
	out := parts[:0]
	for _, p := range parts {
		if p != "" && !(p[0] >= 'A' && p[0] <= 'Z') {
			out = append(out, p)
		}
	}
	return strings.Join(out, ".")
}

// jsonType names a Go type's JSON counterpart.
func jsonType(t reflect.Type) string {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil {
		return "a value"
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a non-negative integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Struct, reflect.Map:
		return "an object"
	}
	return "a JSON value"
}

// CodeMediaType is the code of a request whose body is not declared JSON (415).
const CodeMediaType = "unsupported_media_type"

// CheckJSON refuses a request whose Content-Type is not application/json, as vLLM does (415):
// a form-encoded body (curl -d without -H) is a mistake better reported than guessed at.
func CheckJSON(h http.Header) error {
	ct := h.Get("Content-Type")
	mt, _, err := mime.ParseMediaType(ct)
	if err == nil && mt == "application/json" {
		return nil
	}
	if ct == "" {
		ct = "none"
	}
	return &Error{Status: http.StatusUnsupportedMediaType, Code: CodeMediaType,
		Message: "Content-Type must be application/json, got " + ct}
}
