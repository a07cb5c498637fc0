package frontdoor

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/prefixmesh/prefixmesh/internal/openai"
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

// httpError is a client-visible error with its status, OpenAI code and param (internal/openai).
type httpError = openai.Error

func badRequest(format string, args ...any) error { return openai.Invalid("", format, args...) }

// genRequest is a parsed generation request.
type genRequest struct {
	chat    bool
	model   string // as the client named it
	stream  bool
	text    string                  // completions: a text prompt to tokenise
	msgs    []tokenizer.ChatMessage // chat: messages to render and tokenise
	tokens  []uint32                // completions: a token-id prompt, or the result of tokenising
	session uint64
	// batch holds the prompts of a completions batch of two or more (internal/openai keeps
	// each item's span in the body), which the front door splits into one routed request per
	// prompt; nil otherwise.
	batch []openai.PromptItem
	// promptStart and promptEnd delimit the prompt's value in raw (completions), which the
	// batch's items' spans are relative to.
	promptStart, promptEnd int
	n                      int // the request's n (choices per prompt), 0 when not given

	adapterField *uint64  // the body's adapter_id, if any
	raw          []byte   // the whole body: chat templates read every field (tokenize.go)
	rawBody      *reqBody // raw as re-sendable, for the engine tokenizer; nil until set
}

// parseGen decodes and validates a generation body with the parser the engine uses
// (internal/openai: strict OpenAI shapes, linear in the body).
func parseGen(body []byte, chat bool, header http.Header) (*genRequest, error) {
	var gp *openai.GenParams
	g := &genRequest{chat: chat, raw: body}
	if chat {
		c, err := openai.ParseChat(body)
		if err != nil {
			return nil, err
		}
		gp, g.msgs = &c.GenParams, c.Messages
	} else {
		c, err := openai.ParseCompletion(body)
		if err != nil {
			return nil, err
		}
		gp = &c.GenParams
		g.promptStart, g.promptEnd = c.Prompt.Start, c.Prompt.End
		switch items := c.Prompt.Items; {
		case len(items) > 1:
			g.batch = items
		case items[0].IsText():
			g.text = items[0].Text
		default:
			g.tokens = items[0].IDs
		}
	}
	g.model, g.stream, g.adapterField = gp.Model, gp.Stream, gp.AdapterID
	if gp.N != nil {
		g.n = *gp.N
	}
	g.session = sessionKey(header.Get(HeaderSessionID), gp.SessionID, gp.User)
	return g, nil
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
			return "", 0, &httpError{Status: http.StatusNotFound, Code: codeModelNotFound, Param: "model",
				Message: fmt.Sprintf("model %q does not exist; served: %s", model, strings.Join(models, ", "))}
		}
		base = model[:i]
		if adapter, err = strconv.ParseUint(model[i+1:], 10, 64); err != nil {
			return "", 0, openai.Invalid("model", "model %q: the adapter after %q must be a decimal id", model, base+":")
		}
	}
	if haveField {
		if adapter != 0 && adapter != adapterField {
			return "", 0, openai.Invalid("adapter_id", "adapter_id %d contradicts model %q", adapterField, model)
		}
		adapter = adapterField
	}
	return base, adapter, nil
}
