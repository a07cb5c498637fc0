package tokenizer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// renderTimeout bounds one call to a render server: 5 s, as llm-d's tokenizer sidecar client;
// rendering a long chat on a CPU takes tens of milliseconds, so this only cuts off a hung server.
const renderTimeout = 5 * time.Second

// maxRenderResponseBytes bounds a render answer: 16 MiB holds the ids (and vLLM's sampling
// parameters) of any prompt under the router's 8 MiB body cap.
const maxRenderResponseBytes = 16 << 20

// Render asks a vLLM render server (`vllm launch render --model M`) for the ids, sending the
// whole request so every chat field (tools, chat_template_kwargs, documents …) counts: POST
// /v1/chat/completions/render with the chat body, /v1/completions/render with {model, prompt}.
// A URL ending in /tokenize is an engine's tokenize endpoint instead (vLLM or SGLang), which
// takes the chat body too. For models the Go path refuses.
type Render struct {
	name   string
	base   string // without a trailing slash
	client *http.Client
}

func newRender(spec string) (*Render, error) {
	u := strings.TrimRight(strings.TrimPrefix(spec, RenderPrefix), "/")
	if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
		return nil, fmt.Errorf("%w %q: %s needs an http:// or https:// URL", ErrUnknownTokenizer, spec, RenderPrefix)
	}
	return &Render{name: spec, base: u, client: &http.Client{Timeout: renderTimeout}}, nil
}

// Name is the spec New was given.
func (r *Render) Name() string { return r.name }

// Encode asks the server for text's ids without special tokens; nil if it fails (use
// EncodePrompt, which reports the error).
func (r *Render) Encode(text string) []uint32 {
	ctx, cancel := context.WithTimeout(context.Background(), renderTimeout)
	defer cancel()
	ids, err := r.encodeText(ctx, text, false)
	if err != nil {
		return nil
	}
	return ids
}

// Decode is not offered by render servers: every id decodes to U+FFFD. The router never
// decodes; the simulated engine refuses render specs.
func (r *Render) Decode(ids []uint32) string { return strings.Repeat("\uFFFD", len(ids)) }

// EncodePrompt asks for a completion prompt's ids (special tokens added as vLLM does).
func (r *Render) EncodePrompt(ctx context.Context, text string) ([]uint32, error) {
	return r.encodeText(ctx, text, true)
}

func (r *Render) encodeText(ctx context.Context, text string, special bool) ([]uint32, error) {
	body, err := json.Marshal(map[string]any{"prompt": text, "add_special_tokens": special})
	if err != nil {
		return nil, err
	}
	if r.tokenizeEndpoint() {
		return r.post(ctx, r.base, body)
	}
	return r.post(ctx, r.base+"/v1/completions/render", body)
}

// EncodeChat sends the chat body unchanged.
func (r *Render) EncodeChat(ctx context.Context, body []byte) ([]uint32, error) {
	if r.tokenizeEndpoint() {
		return r.post(ctx, r.base, body)
	}
	return r.post(ctx, r.base+"/v1/chat/completions/render", body)
}

func (r *Render) tokenizeEndpoint() bool { return strings.HasSuffix(r.base, "/tokenize") }

func (r *Render) post(ctx context.Context, url string, body []byte) ([]uint32, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("render: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxRenderResponseBytes+1))
	if err != nil {
		return nil, fmt.Errorf("render: read answer: %w", err)
	}
	if len(b) > maxRenderResponseBytes {
		return nil, fmt.Errorf("render: answer over %d bytes", maxRenderResponseBytes)
	}
	if resp.StatusCode != http.StatusOK {
		msg := bytes.TrimSpace(b)
		if len(msg) > 512 {
			msg = msg[:512]
		}
		err := fmt.Errorf("render: %s answered %d: %s", url, resp.StatusCode, msg)
		if resp.StatusCode == http.StatusBadRequest || resp.StatusCode == http.StatusUnprocessableEntity {
			return nil, fmt.Errorf("%w: %w", ErrBadChat, err)
		}
		return nil, err
	}
	return parseRenderAnswer(b)
}

// parseRenderAnswer reads {"token_ids": […]} (render), [{"token_ids": […]}] (completions
// render, one per prompt) or {"tokens": […]} (/tokenize).
func parseRenderAnswer(b []byte) ([]uint32, error) {
	var one struct {
		TokenIDs []uint32 `json:"token_ids"`
		Tokens   []uint32 `json:"tokens"`
	}
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '[' {
		var many []json.RawMessage
		if err := json.Unmarshal(b, &many); err != nil {
			return nil, fmt.Errorf("render: decode answer: %w", err)
		}
		if len(many) != 1 {
			return nil, fmt.Errorf("render: %d answers for one prompt", len(many))
		}
		b = many[0]
	}
	if err := json.Unmarshal(b, &one); err != nil {
		return nil, fmt.Errorf("render: decode answer: %w", err)
	}
	switch {
	case one.TokenIDs != nil:
		return one.TokenIDs, nil
	case one.Tokens != nil:
		return one.Tokens, nil
	}
	return nil, errors.New("render: answer has neither token_ids nor tokens")
}
