package frontdoor

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/prefixmesh/prefixmesh/internal/tokenizer"
	"github.com/prefixmesh/prefixmesh/routing"
)

// HeaderSessionID names a conversation; requests with the same value stay on one node while it
// is healthy and within the load bound. The body fields "session_id" and "user" are used when
// the header is absent.
const HeaderSessionID = "X-Session-ID"

// Response headers the front door adds.
const (
	HeaderNode     = "X-Prefixmesh-Node"
	HeaderEstimate = "X-Prefixmesh-Estimated-Tokens"
	// HeaderCachedTokens is the engine's cached_tokens header (node/simengine sets it).
	HeaderCachedTokens = "X-Prefixmesh-Cached-Tokens"
)

// httpError is a client-visible error with its status and OpenAI code.
type httpError struct {
	status int
	code   string
	msg    string
}

func (e *httpError) Error() string { return e.msg }

func badRequest(format string, args ...any) error {
	return &httpError{status: http.StatusBadRequest, code: codeInvalid, msg: fmt.Sprintf(format, args...)}
}

// genBody is the part of a generation request the router reads; everything else is forwarded
// untouched (the body is forwarded byte for byte, not re-encoded).
type genBody struct {
	Model     string                  `json:"model"`
	Prompt    json.RawMessage         `json:"prompt"`
	Messages  []tokenizer.ChatMessage `json:"messages"`
	Stream    bool                    `json:"stream"`
	AdapterID *uint64                 `json:"adapter_id"`
	User      string                  `json:"user"`
	SessionID string                  `json:"session_id"`
}

// genRequest is a parsed generation request.
type genRequest struct {
	chat    bool
	model   string // as the client named it
	stream  bool
	text    string                  // completions: a text prompt to tokenise
	msgs    []tokenizer.ChatMessage // chat: messages to render and tokenise
	tokens  []uint32                // completions: a token-id prompt, or the result of tokenising
	session uint64

	adapterField *uint64 // the body's adapter_id, if any
}

// parseGen decodes and validates a generation body.
func parseGen(body []byte, chat bool, header http.Header) (*genRequest, error) {
	var b genBody
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&b); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return nil, badRequest("field %q: expected %s, got JSON %s", te.Field, te.Type, te.Value)
		}
		if errors.As(err, &te) {
			return nil, badRequest("request body: expected a JSON object, got JSON %s", te.Value)
		}
		return nil, badRequest("invalid JSON: %v", err)
	}
	if dec.More() {
		return nil, badRequest("invalid JSON: trailing data after the request object")
	}
	g := &genRequest{chat: chat, model: b.Model, stream: b.Stream}
	if chat {
		if err := checkMessages(b.Messages); err != nil {
			return nil, err
		}
		g.msgs = b.Messages
	} else if err := g.setPrompt(b.Prompt); err != nil {
		return nil, err
	}
	g.adapterField = b.AdapterID
	g.session = sessionKey(header.Get(HeaderSessionID), b.SessionID, b.User)
	return g, nil
}

// setPrompt accepts what the engine accepts: a string, an array of token ids, or a one-element
// array of either.
func (g *genRequest) setPrompt(raw json.RawMessage) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return badRequest("field \"prompt\" is required")
	}
	var text string
	if err := json.Unmarshal(raw, &text); err == nil {
		if text == "" {
			return badRequest("field \"prompt\" is empty")
		}
		g.text = text
		return nil
	}
	if ids, ok := parseIDs(raw); ok {
		if len(ids) == 0 {
			return badRequest("field \"prompt\" is empty")
		}
		g.tokens = ids
		return nil
	}
	var ids []float64
	if err := json.Unmarshal(raw, &ids); err == nil {
		if len(ids) == 0 {
			return badRequest("field \"prompt\" is empty")
		}
		g.tokens = make([]uint32, len(ids))
		for i, f := range ids {
			if f < 0 || f > math.MaxUint32 || f != math.Trunc(f) {
				return badRequest("prompt[%d] = %v is not a token id (an integer in 0..%d)", i, f, uint32(math.MaxUint32))
			}
			g.tokens[i] = uint32(f)
		}
		return nil
	}
	var batch []json.RawMessage
	if err := json.Unmarshal(raw, &batch); err == nil && len(batch) == 1 {
		return g.setPrompt(batch[0])
	} else if err == nil && len(batch) > 1 {
		return badRequest("field \"prompt\": batches of %d prompts are not supported; send one per request", len(batch))
	}
	return badRequest("field \"prompt\" must be a string or an array of token ids")
}

// checkMessages applies the engine's rules, so a request the router routes is one the engine
// tokenises the same way.
func checkMessages(msgs []tokenizer.ChatMessage) error {
	if len(msgs) == 0 {
		return badRequest("field \"messages\" is required and must not be empty")
	}
	for i, m := range msgs {
		if m.Role == "" || strings.ContainsAny(m.Role, "|<>\n") {
			return badRequest("messages[%d].role %q must be a non-empty name without '|', '<', '>' or newlines", i, m.Role)
		}
	}
	return nil
}

// sessionKey is the routing key of the first non-empty session name (routing.SessionKey, the
// function gRPC Route uses, so both paths agree); 0 means none.
func sessionKey(names ...string) uint64 {
	for _, n := range names {
		if n != "" {
			return routing.SessionKey(n)
		}
	}
	return 0
}

// resolveModel maps the requested model to a served base model and adapter, the way the engine
// does: an exact served name, or "<served name>:<decimal adapter id>"; "" routes to any node.
// An explicit adapter_id must agree with the name's.
func resolveModel(models []string, model string, adapterField uint64, haveField bool) (base string, adapter uint64, err error) {
	switch {
	case model == "" || len(models) == 0 || slices.Contains(models, model):
		base = model
	default:
		i := strings.LastIndexByte(model, ':')
		if i <= 0 || !slices.Contains(models, model[:i]) {
			return "", 0, &httpError{status: http.StatusNotFound, code: codeModelNotFound,
				msg: fmt.Sprintf("model %q does not exist; served: %s", model, strings.Join(models, ", "))}
		}
		base = model[:i]
		if adapter, err = strconv.ParseUint(model[i+1:], 10, 64); err != nil {
			return "", 0, badRequest("model %q: the adapter after %q must be a decimal id", model, base+":")
		}
	}
	if haveField {
		if adapter != 0 && adapter != adapterField {
			return "", 0, badRequest("adapter_id %d contradicts model %q", adapterField, model)
		}
		adapter = adapterField
	}
	return base, adapter, nil
}

// parseIDs is the fast path for the common token-id prompt: a JSON array of plain decimal
// integers below 2^32 (reflection-based decoding into []float64 cost most of the front door's
// own CPU time per request, BenchmarkProxy). Anything else — fractions, exponents, signs, nested
// arrays, out-of-range values — answers ok = false and takes the general path, which reports
// errors precisely.
func parseIDs(raw []byte) (ids []uint32, ok bool) {
	if len(raw) < 2 || raw[0] != '[' || raw[len(raw)-1] != ']' {
		return nil, false
	}
	n := 1 + bytes.Count(raw, []byte(","))
	ids = make([]uint32, 0, n)
	i, end := 1, len(raw)-1
	skip := func() {
		for i < end && (raw[i] == ' ' || raw[i] == '\n' || raw[i] == '\t' || raw[i] == '\r') {
			i++
		}
	}
	skip()
	if i == end {
		return ids, true
	}
	for {
		skip()
		start := i
		var v uint64
		for i < end && raw[i] >= '0' && raw[i] <= '9' {
			v = v*10 + uint64(raw[i]-'0')
			if v > math.MaxUint32 {
				return nil, false
			}
			i++
		}
		if i == start || (raw[start] == '0' && i-start > 1) { // no digits, or a leading zero (invalid JSON)
			return nil, false
		}
		ids = append(ids, uint32(v))
		skip()
		if i == end {
			return ids, true
		}
		if raw[i] != ',' {
			return nil, false
		}
		i++
	}
}
