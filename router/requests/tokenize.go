package requests

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixmesh/prefixmesh/internal/openai"
	"github.com/prefixmesh/prefixmesh/internal/tokenizer"
)

// MaxTokenizeResponseBytes bounds an engine's /tokenize answer (and the front door's pass-through
// of one): 16 MiB holds the ids of a prompt at the body cap (8 MiB of text is at most 8Mi tokens
// in the worst case, ~2 bytes each in JSON for small ids; real vocabularies give fewer, longer
// ids).
const MaxTokenizeResponseBytes = 16 << 20

// promptTokenizer turns a request's prompt into the token ids the engine will see.
type promptTokenizer interface {
	tokens(ctx context.Context, g *GenRequest, model string) ([]uint32, error)
}

// embeddedTokenizer uses a tokenizer of internal/tokenizer: a vocabulary compiled into the router
// or loaded from a model's files (hf:DIR), the same code as the engine's, or a render server
// (render:URL). Chat requests go through the model's template with every field of the body.
type embeddedTokenizer struct {
	tok     tokenizer.Tokenizer
	inexact *prometheus.CounterVec // reason; nil in tests that build it bare
}

func (e embeddedTokenizer) tokens(ctx context.Context, g *GenRequest, _ string) ([]uint32, error) {
	var toks []uint32
	var err error
	switch {
	case g.Chat:
		toks, err = tokenizer.EncodeChat(ctx, e.tok, g.Raw, g.Msgs)
	case g.Tokens != nil:
		return g.Tokens, nil
	default:
		toks, err = tokenizer.EncodePrompt(ctx, e.tok, g.Text)
	}
	switch {
	case err == nil:
		return toks, nil
	case tokenizer.IsInexact(err):
		// The request is valid but cannot be tokenized exactly here (say, a float 1.0 in tool
		// arguments, which Python prints as "1.0"): route it without a prefix estimate rather
		// than on approximate ids or not at all.
		if e.inexact != nil {
			e.inexact.WithLabelValues(tokenizer.InexactReason(err)).Inc()
		}
		return nil, nil
	case errors.Is(err, tokenizer.ErrBadChat):
		return nil, openai.Invalid("", "%v", err)
	}
	return nil, err
}

// idsOnly accepts token-id prompts only (TokenizerNone).
type idsOnly struct{}

func (idsOnly) tokens(_ context.Context, g *GenRequest, _ string) ([]uint32, error) {
	if !g.Chat && g.Tokens != nil {
		return g.Tokens, nil
	}
	return nil, openai.Invalid("", "this router has no tokenizer (--tokenizer %s): send the prompt to /v1/completions as an array of token ids", TokenizerNone)
}

// engineTokenizer asks a healthy node's engine (POST /tokenize), trying a second node if the
// first fails: for models whose vocabulary the router does not embed.
type engineTokenizer struct {
	src     NodeSource
	ejector Ejector // may be nil
	client  *http.Client
}

// EngineTokenizeAttempts is how many nodes are asked before giving up (here, and by the front
// door's /tokenize pass-through): one retry, as for generation.
const EngineTokenizeAttempts = 2

func (e *engineTokenizer) tokens(ctx context.Context, g *GenRequest, model string) ([]uint32, error) {
	if !g.Chat && g.Tokens != nil {
		return g.Tokens, nil
	}
	var body Body
	if g.Chat && g.Body != nil {
		// The whole chat body: tools, chat_template_kwargs, add_generation_prompt … all change
		// the prompt, and vLLM's and SGLang's /tokenize take them.
		body = g.Body
	} else if g.Chat {
		body = BytesBody(g.Raw)
	} else {
		b, err := json.Marshal(map[string]any{"model": g.Model, "prompt": g.Text})
		if err != nil {
			return nil, fmt.Errorf("tokenize: encode request: %w", err)
		}
		body = BytesBody(b)
	}
	tried := 0
	var last error = ErrNoNodes
	for _, n := range e.src.Nodes() {
		in := &n.Info
		if !in.Alive || in.Draining || (model != "" && in.Model != model) || (e.ejector != nil && e.ejector.Ejected(in.ID)) {
			continue
		}
		if tried == EngineTokenizeAttempts {
			break
		}
		tried++
		toks, err := e.ask(ctx, n.EngineURL, body)
		if err == nil {
			return toks, nil
		}
		last = fmt.Errorf("tokenize on %s: %w", in.ID, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, last
}

// engineTokenizeTimeout bounds one /tokenize call to an engine: tokenising the largest body
// takes milliseconds; a node that does not answer in 10 s is hung, and the next node is tried.
const engineTokenizeTimeout = 10 * time.Second

func (e *engineTokenizer) ask(ctx context.Context, engineURL string, body Body) ([]uint32, error) {
	ctx, cancel := context.WithTimeout(ctx, engineTokenizeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, engineURL+"/tokenize", nil)
	if err != nil {
		return nil, err
	}
	body.Attach(req)
	req.Header.Set("Content-Type", "application/json")
	resp, err := e.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, MaxTokenizeResponseBytes))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status %d: %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	var r struct {
		Tokens []uint32 `json:"tokens"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("decode /tokenize answer: %w", err)
	}
	return r.Tokens, nil
}

// BytesBody is a body held in one slice, sent again as it is (a disaggregated request's legs,
// a chat body sent to an engine's /tokenize).
type BytesBody []byte

// Attach implements Body.
func (b BytesBody) Attach(req *http.Request) {
	req.Body = io.NopCloser(bytes.NewReader(b))
	req.ContentLength = int64(len(b))
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
}
