package simengine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prefixmesh/prefixmesh/internal/httpstatus"
	"github.com/prefixmesh/prefixmesh/internal/openai"
	"github.com/prefixmesh/prefixmesh/local/kvpool"
)

// Handler returns the engine's HTTP API:
//
//	POST /v1/completions       prompt: text, token ids, or a batch of one of either (internal/openai)
//	POST /v1/chat/completions  messages rendered by tokenizer.EncodeChat (the model's template for hf:DIR)
//	GET  /v1/models
//	POST /tokenize             {"prompt": text} or {"messages": [...]} → {"tokens", "count"}
//	POST /detokenize           {"tokens": [...]} → {"prompt": text}
//	GET  /health, GET /version  as vLLM serves them
//
// Generation answers JSON, or SSE with `stream: true` (chunks flushed as produced, then
// `data: [DONE]`). POST bodies must be declared application/json (415 otherwise, as vLLM).
// Errors are OpenAI-shaped: {"error": {"message", "type", "param", "code"}}, with Retry-After on
// 429 and 503.
func (e *Engine) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST /v1/completions", e.instrument("completions", e.serveGenerate(false)))
	mux.Handle("POST /v1/chat/completions", e.instrument("chat_completions", e.serveGenerate(true)))
	mux.Handle("GET /v1/models", e.instrument("models", http.HandlerFunc(e.serveModels)))
	mux.Handle("POST /tokenize", e.instrument("tokenize", http.HandlerFunc(e.serveTokenize)))
	mux.Handle("POST /detokenize", e.instrument("detokenize", http.HandlerFunc(e.serveDetokenize)))
	mux.Handle("GET /health", e.instrument("health", http.HandlerFunc(e.serveHealth)))
	mux.Handle("GET /version", e.instrument("version", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"version": "prefixmesh-sim"})
	})))
	for path, method := range map[string]string{"/v1/completions": "POST", "/v1/chat/completions": "POST",
		"/v1/models": "GET", "/tokenize": "POST", "/detokenize": "POST", "/health": "GET", "/version": "GET"} {
		mux.Handle(path, e.instrument("other", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", method)
			writeError(w, &openai.Error{Status: http.StatusMethodNotAllowed, Code: "method_not_allowed",
				Message: fmt.Sprintf("%s %s: use %s", r.Method, path, method)})
		})))
	}
	mux.Handle("/", e.instrument("other", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &openai.Error{Status: http.StatusNotFound, Code: "not_found",
			Message: fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path)})
	})))
	return mux
}

// serveHealth is vLLM's liveness check: 200 with an empty body while the engine runs, 503 once
// it has stopped; a node agent in --engine vllm mode follows it.
func (e *Engine) serveHealth(w http.ResponseWriter, _ *http.Request) {
	e.mu.Lock()
	up := e.started && !e.closed
	e.mu.Unlock()
	if !up {
		writeError(w, errClosed)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (e *Engine) instrument(endpoint string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := httpstatus.Wrap(w)
		h.ServeHTTP(sw, r)
		e.met.requests.WithLabelValues(endpoint, strconv.Itoa(sw.Status())).Inc()
	})
}

// writeError maps an error to its status and writes the OpenAI-shaped body (internal/openai).
func writeError(w http.ResponseWriter, err error) {
	status, code := http.StatusInternalServerError, "internal_error"
	var oe *openai.Error
	var mb *http.MaxBytesError
	switch {
	case errors.As(err, &oe):
		openai.WriteError(w, oe)
		return
	case errors.As(err, &mb):
		status, code = http.StatusRequestEntityTooLarge, "request_too_large"
		err = fmt.Errorf("request body exceeds %d bytes", mb.Limit)
	case errors.Is(err, kvpool.ErrTooLarge):
		status, code = http.StatusBadRequest, "context_length_exceeded"
	case errors.Is(err, errQueueFull):
		status, code = http.StatusTooManyRequests, "queue_full"
	case errors.Is(err, errExhausted):
		status, code = http.StatusServiceUnavailable, "kv_pool_exhausted"
	case errors.Is(err, errClosed), errors.Is(err, context.Canceled):
		status, code = http.StatusServiceUnavailable, "engine_unavailable"
	}
	openai.WriteError(w, &openai.Error{Status: status, Code: code, Message: err.Error()})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v) // the client may be gone; nothing to do about it
}

// readBody reads at most MaxBodyBytes; more is an *http.MaxBytesError (413).
func (e *Engine) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	return io.ReadAll(http.MaxBytesReader(w, r.Body, e.cfg.MaxBodyBytes))
}

func (e *Engine) serveModels(w http.ResponseWriter, _ *http.Request) {
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	writeJSON(w, http.StatusOK, struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{"list", []model{{e.cfg.Model, "model", e.created, "prefixmesh"}}})
}

func (e *Engine) serveTokenize(w http.ResponseWriter, r *http.Request) {
	if err := openai.CheckJSON(r.Header); err != nil {
		writeError(w, err)
		return
	}
	body, err := e.readBody(w, r)
	if err != nil {
		writeError(w, err)
		return
	}
	toks, err := e.parseTokenize(body)
	if err != nil {
		writeError(w, err)
		return
	}
	if toks == nil {
		toks = []uint32{}
	}
	writeJSON(w, http.StatusOK, tokenizeResponse{Tokens: toks, Count: len(toks)})
}

func (e *Engine) serveDetokenize(w http.ResponseWriter, r *http.Request) {
	if err := openai.CheckJSON(r.Header); err != nil {
		writeError(w, err)
		return
	}
	body, err := e.readBody(w, r)
	if err != nil {
		writeError(w, err)
		return
	}
	var req struct {
		Model  string          `json:"model"`
		Tokens json.RawMessage `json:"tokens"`
	}
	if err := openai.Decode(body, &req); err != nil {
		writeError(w, err)
		return
	}
	ids, err := openai.ParseIDs(req.Tokens, "tokens")
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"prompt": e.tok.Decode(ids)})
}

type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

type message struct {
	Role    string `json:"role,omitempty"`
	Content string `json:"content"`
}

type choice struct {
	Index        int       `json:"index"`
	Text         *string   `json:"text,omitempty"`    // completions
	Message      *message  `json:"message,omitempty"` // chat, non-streaming
	Delta        *message  `json:"delta,omitempty"`   // chat, streaming
	Logprobs     *struct{} `json:"logprobs"`
	FinishReason *string   `json:"finish_reason"`
}

type response struct {
	ID      string   `json:"id"`
	Object  string   `json:"object"`
	Created int64    `json:"created"`
	Model   string   `json:"model"`
	Choices []choice `json:"choices"`
	Usage   *usage   `json:"usage,omitempty"`
	// KVTransferParams is set on a finished prefill leg's response (kvtransfer.go), top-level
	// as vLLM's CompletionResponse and ChatCompletionResponse carry it.
	KVTransferParams *kvTransferOut `json:"kv_transfer_params,omitempty"`
}

func (e *Engine) serveGenerate(chat bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrival := e.clk.Now()
		if err := openai.CheckJSON(r.Header); err != nil {
			writeError(w, err)
			return
		}
		body, err := e.readBody(w, r)
		if err != nil {
			writeError(w, err)
			return
		}
		var req *genRequest
		if chat {
			req, err = e.parseChat(body)
		} else {
			req, err = e.parseCompletion(body)
		}
		if err != nil {
			writeError(w, err)
			return
		}
		if e.cfg.KVSideChannel != "" { // without a connector, vLLM ignores the field
			req.kv = parseKVParams(body)
		}
		engineCtx, err := e.begin()
		if err != nil {
			writeError(w, err)
			return
		}
		defer e.inflight.Done()
		// The request ends when the client goes away or the engine closes.
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		defer context.AfterFunc(engineCtx, cancel)()
		e.generate(ctx, engineCtx, w, req, arrival)
	})
}

// generate runs one admitted request to the end and writes its response.
func (e *Engine) generate(ctx, engineCtx context.Context, w http.ResponseWriter, req *genRequest, arrival time.Time) {
	leg := req.kv.leg()
	a := admission{tokens: req.tokens, adapter: req.adapter, out: req.maxTokens, want: req.maxTokens}
	if leg == legPrefill {
		// The last sampled token's KV is never computed, so a prefill leg of max_tokens 1 holds
		// exactly its prompt's blocks, the ones its lease names.
		a.out = max(req.maxTokens-1, 0)
	}
	pulls := req.kv != nil && (req.kv.remotePrefill || req.kv.source != nil)
	a.deferCharge = pulls
	var keepAlive func()
	rb := req.kv.leasedRemote()
	if rb != nil {
		keepAlive = func() { e.heartbeat(ctx, rb) }
	}
	tk, err := e.acquire(ctx, a, keepAlive, max(e.cfg.KVLeaseDuration/6, time.Millisecond))
	if err != nil {
		if engineCtx.Err() == nil {
			e.releaseRemote(engineCtx, rb) // this decode leg will never read the prefill's blocks
		}
		if ctx.Err() != nil && engineCtx.Err() == nil {
			return // the client left while queued
		}
		writeError(w, err)
		return
	}
	defer e.release(tk)
	e.met.legs.WithLabelValues(leg).Inc()
	var pr pullResult
	if pulls {
		if pr = e.pull(ctx, tk, req); pr.outcome == outcomeFail {
			// kv_load_failure_policy "fail": vLLM finishes the request with an error, which its
			// OpenAI server answers as a 500 "Internal server error" (GenerationError;
			// vllm-project/vllm tests/entrypoints/openai/responses/test_errors.py).
			writeError(w, &openai.Error{Status: http.StatusInternalServerError, Code: "kv_load_failed",
				Message: fmt.Sprintf("Internal server error: the KV transfer failed and kv_load_failure_policy is fail: %v", pr.err)})
			return
		}
	}
	cached := tk.cached
	w.Header().Set(HeaderCachedTokens, strconv.Itoa(cached))

	// Unique across nodes: a random per-engine prefix, then this engine's counter.
	resp := response{ID: fmt.Sprintf("cmpl-%016x%016x", e.idPrefix, e.ids.Add(1)), Object: "text_completion",
		Created: arrival.Unix(), Model: req.model}
	if req.chat {
		resp.ID = "chat" + resp.ID
		resp.Object = "chat.completion"
	}
	var sse *sseWriter
	if req.stream {
		sse = newSSE(w)
		if req.chat { // OpenAI's first chat chunk carries the role
			resp.Object = "chat.completion.chunk"
			sse.send(resp, choice{Delta: &message{Role: "assistant"}})
		}
	}

	if e.awaitKV(ctx, tk) != nil { // a CPU-tier load or a transfer, before the steps take it
		e.abort(w, sse, engineCtx)
		return
	}
	// The steps compute the request (step.go); each token goes out once they have produced it.
	out := e.outputTokens(req.tokens, req.adapter, req.maxTokens)
	var text strings.Builder
	for i := range out {
		if e.awaitToken(ctx, tk, i) != nil {
			e.abort(w, sse, engineCtx)
			return
		}
		if i == 0 {
			e.met.ttft.Observe(e.clk.Now().Sub(arrival).Seconds())
		}
		piece := e.tok.Decode(out[i : i+1])
		e.met.outputTokens.Inc()
		switch {
		case sse == nil:
			text.WriteString(piece)
		case req.chat:
			sse.send(resp, choice{Delta: &message{Content: piece}})
		default:
			sse.send(resp, choice{Text: &piece})
		}
	}

	var kvOut *kvTransferOut
	if leg == legPrefill {
		kvOut = e.finishPrefillLeg(tk, resp.ID)
	}
	e.log.Debug("request done", "leg", leg, "prompt_tokens", len(req.tokens), "cached_tokens", cached,
		"pulled_tokens", pr.tokens, "pull", pr.outcome, "leased", kvOut != nil,
		"output_tokens", len(out), "adapter", req.adapter, "elapsed", e.clk.Now().Sub(arrival))
	u := &usage{PromptTokens: len(req.tokens), CompletionTokens: len(out), TotalTokens: len(req.tokens) + len(out)}
	u.PromptTokensDetails.CachedTokens = cached
	finish := "length"
	if sse != nil {
		last := choice{FinishReason: &finish}
		if req.chat {
			last.Delta = &message{}
		} else {
			empty := ""
			last.Text = &empty
		}
		sse.send(resp, last)
		if req.includeUsage {
			resp.Usage = u
			sse.send(resp)
		}
		sse.done()
		return
	}
	full := text.String()
	c := choice{FinishReason: &finish}
	if req.chat {
		c.Message = &message{Role: "assistant", Content: full}
	} else {
		c.Text = &full
	}
	resp.Choices = []choice{c}
	resp.Usage = u
	resp.KVTransferParams = kvOut
	writeJSON(w, http.StatusOK, resp)
}

// finishPrefillLeg leases a finished prefill leg's blocks and returns the kv_transfer_params
// its response carries, as NixlConnector's request_finished does for a request that finished
// by length or stop (pull_scheduler.py); nil when the engine is closing (the blocks are freed).
func (e *Engine) finishPrefillLeg(tk *ticket, id string) *kvTransferOut {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	blocks := e.leaseLocked(tk, id)
	return &kvTransferOut{
		DoRemotePrefill: true,
		DoRemoteDecode:  false,
		RemoteBlockIDs:  [][]uint32{blocks},
		RemoteEngineID:  e.engineID,
		RemoteRequestID: id,
		RemoteHost:      e.sideHost,
		RemotePort:      e.sidePort,
		TPSize:          1,
		DCPSize:         1,
		PPSize:          1,
		RemoteNumTokens: len(tk.tokens),
		TransferMode:    "pull",
	}
}

// abort ends a request cut short: silently if the client left, with 503 (or an SSE error
// event once streaming) if the engine is closing.
func (e *Engine) abort(w http.ResponseWriter, sse *sseWriter, engineCtx context.Context) {
	if engineCtx.Err() == nil {
		return
	}
	if sse != nil {
		sse.event(openai.NewErrorBody(http.StatusServiceUnavailable, "engine_unavailable", "", errClosed.Error()))
		return
	}
	writeError(w, errClosed)
}

// sseWriter writes server-sent events, flushing each one.
type sseWriter struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func newSSE(w http.ResponseWriter) *sseWriter {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // keep proxies from buffering the stream
	w.WriteHeader(http.StatusOK)
	s := &sseWriter{w: w, rc: http.NewResponseController(w)}
	_ = s.rc.Flush()
	return s
}

// send writes resp as a chunk with the given choices (none for the usage chunk).
func (s *sseWriter) send(resp response, choices ...choice) {
	if choices == nil {
		choices = []choice{}
	}
	resp.Choices = choices
	s.event(resp)
}

func (s *sseWriter) event(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		return // our own types always marshal
	}
	// Write errors mean the client left; the request context ends the loop.
	_, _ = fmt.Fprintf(s.w, "data: %s\n\n", b)
	_ = s.rc.Flush()
}

func (s *sseWriter) done() {
	_, _ = io.WriteString(s.w, "data: [DONE]\n\n")
	_ = s.rc.Flush()
}
