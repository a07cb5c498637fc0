package requests

import (
	"context"
	"errors"
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

// HeaderCachedTokens is the engine's cached_tokens header (node/simengine sets it), read from
// the response beside the body's usage.
const HeaderCachedTokens = "X-Prefixmesh-Cached-Tokens"

// MaxPromptTokens bounds a routed prompt: the one prompt token cap of every door
// (internal/openai.MaxPromptTokens, where it is explained).
const MaxPromptTokens = openai.MaxPromptTokens

// GenRequest is a parsed generation request (POST /v1/completions or /v1/chat/completions).
type GenRequest struct {
	Chat   bool
	Model  string // as the client named it
	Stream bool
	Text   string                  // completions: a text prompt to tokenise
	Msgs   []tokenizer.ChatMessage // chat: messages to render and tokenise
	Tokens []uint32                // completions: a token-id prompt, or the result of tokenising
	// Session is the routing key of the request's session (HeaderSessionID, else the body's
	// session_id or user), 0 for none.
	Session uint64
	// Batch holds the prompts of a completions batch of two or more (internal/openai keeps
	// each item's span in the body), which the front door splits into one routed request per
	// prompt; nil otherwise.
	Batch []openai.PromptItem
	// PromptStart and PromptEnd delimit the prompt's value in Raw (completions), which the
	// batch's items' spans are relative to.
	PromptStart, PromptEnd int
	N                      int // the request's n (choices per prompt), 0 when not given

	AdapterID *uint64 // the body's adapter_id, if any
	Raw       []byte  // the whole body: chat templates read every field (tokenize.go)
	// Body is Raw as the door can send it again (its pooled body), for the engine tokenizer;
	// nil sends Raw as it is.
	Body Body
}

// Body is a request body a door can send again: the engine tokenizer sends a chat body whole to
// an engine's /tokenize.
type Body interface {
	// Attach sets req's body to it, with GetBody for the Transport's own retries.
	Attach(req *http.Request)
}

// ParseGen decodes and validates a generation body with the parser the engine uses
// (internal/openai: strict OpenAI shapes, linear in the body); the session is read from header.
func ParseGen(body []byte, chat bool, header http.Header) (*GenRequest, error) {
	var gp *openai.GenParams
	g := &GenRequest{Chat: chat, Raw: body}
	if chat {
		c, err := openai.ParseChat(body)
		if err != nil {
			return nil, err
		}
		gp, g.Msgs = &c.GenParams, c.Messages
	} else {
		c, err := openai.ParseCompletion(body)
		if err != nil {
			return nil, err
		}
		gp = &c.GenParams
		g.PromptStart, g.PromptEnd = c.Prompt.Start, c.Prompt.End
		switch items := c.Prompt.Items; {
		case len(items) > 1:
			g.Batch = items
		case items[0].IsText():
			g.Text = items[0].Text
		default:
			g.Tokens = items[0].IDs
		}
	}
	g.Model, g.Stream, g.AdapterID = gp.Model, gp.Stream, gp.AdapterID
	if gp.N != nil {
		g.N = *gp.N
	}
	g.Session = sessionKey(header.Get(HeaderSessionID), gp.SessionID, gp.User)
	return g, nil
}

// sessionKey is the routing key of the first non-empty session name (routing.SessionKey, the
// function gRPC Route uses, so every door agrees); 0 means none.
func sessionKey(names ...string) uint64 {
	for _, n := range names {
		if n != "" {
			return routing.SessionKey(n)
		}
	}
	return 0
}

// ResolveModel maps g's model to a served base model and adapter (resolveModel over the
// models the nodes serve now).
func (s *Service) ResolveModel(g *GenRequest) (base string, adapter uint64, err error) {
	return resolveModel(s.picker.Models(), g.Model, derefU64(g.AdapterID), g.AdapterID != nil)
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
			return "", 0, modelNotFound(models, model)
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

// KnownModel is ResolveModel's not-found rule for a request that names a model but no adapter
// field (a /tokenize pass-through): nil for "" (any node), a served name or "<served
// name>:<anything>" (the engine judges the adapter), when nothing is served yet, and otherwise
// the 404.
func (s *Service) KnownModel(model string) error {
	models := s.picker.Models()
	if model == "" || len(models) == 0 || slices.Contains(models, model) {
		return nil
	}
	if i := strings.LastIndexByte(model, ':'); i > 0 && slices.Contains(models, model[:i]) {
		return nil
	}
	return modelNotFound(models, model)
}

// modelNotFound is the 404 of a model no node serves, naming the served ones.
func modelNotFound(models []string, model string) *openai.Error {
	return &openai.Error{Status: http.StatusNotFound, Code: CodeModelNotFound, Param: "model",
		Message: fmt.Sprintf("model %q does not exist; served: %s", model, strings.Join(models, ", "))}
}

func derefU64(p *uint64) uint64 {
	if p == nil {
		return 0
	}
	return *p
}

// PromptTokens is g's prompt's token ids for the base model (tokenised, or the request's own
// ids) under the prompt token cap: the parser holds id arrays to it as it reads them, and
// tokenised text and chat are held to it here, by the same check
// (internal/openai.CheckPromptTokens). It returns nil ids and no error for a request that
// cannot be tokenised exactly here (routed by load); an *openai.Error for a request refused
// for its prompt (IsTooLong for the cap); an error wrapping ErrNoNodes when no engine can
// tokenise it.
func (s *Service) PromptTokens(ctx context.Context, g *GenRequest, base string) ([]uint32, error) {
	tctx, span := s.tokenizeSpan(ctx, g)
	toks, err := s.tok.tokens(tctx, g, base)
	if err == nil {
		if err = openai.CheckPromptTokens(len(toks)); err != nil {
			toks = nil
		}
	}
	tokenized(span, len(toks), err)
	return toks, err
}

// IsTooLong reports whether err is a refusal for size (413): a prompt over the token cap.
func IsTooLong(err error) bool {
	if err == nil {
		return false // before errors.As, whose target would escape: no allocation on the way through
	}
	var he *openai.Error
	return errors.As(err, &he) && he.Status == http.StatusRequestEntityTooLarge
}
