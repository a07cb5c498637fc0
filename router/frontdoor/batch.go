package frontdoor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prefixmesh/prefixmesh/internal/httpstatus"
	"github.com/prefixmesh/prefixmesh/router/requests"
)

// maxBatchFanout bounds the prompts of one batch in flight at once: 16 keeps a 256-prompt batch
// (internal/openai.MaxBatchPrompts) from taking a whole node's sequence slots at once while
// still running a typical batch (a few prompts) fully in parallel. The batch holds one admission
// slot.
const maxBatchFanout = 16

// maxBatchUpstreamBytes bounds what a split batch sends to engines in all: each prompt's request
// carries every other field of the body again, so a body of 256 one-character prompts beside an
// 8 MB unknown field would send 2 GiB. 64 MiB (eight of the largest bodies) still takes a full
// 256-prompt batch beside 250 KB of shared fields (a large guided-decoding schema); past it the
// batch is refused with 413 before anything is sent.
const maxBatchUpstreamBytes = 64 << 20

// A completions batch (a prompt that is an array of strings or of token-id arrays, as every
// OpenAI client library sends) is split into one request per prompt, each routed on its own to
// the node holding its prefix, and the answers are merged as vLLM answers a batch: choice i·n+j
// for choice j of prompt i, usage summed, one [DONE]. Each prompt is its own request line in the
// log and the metrics. A prompt's body is a view of the batch's body with the prompt value
// replaced by that prompt's JSON (newSplicedBody): nothing is copied or re-encoded, so a batch
// costs the router its body once whatever its number of prompts.

// batchItem is one prompt of a batch, as its own request.
type batchItem struct {
	g    *requests.GenRequest
	body *reqBody // spliced from the batch's body; released when the prompt's request ends
}

// batchUpstreamBytes is what splitting g sends upstream in all: every prompt's JSON once, and
// the rest of the body once per prompt.
func batchUpstreamBytes(g *requests.GenRequest, bodyLen int) int64 {
	shared := int64(bodyLen - (g.PromptEnd - g.PromptStart))
	total := shared * int64(len(g.Batch))
	for _, it := range g.Batch {
		total += int64(it.End - it.Start)
	}
	return total
}

func (s *Server) serveBatch(w http.ResponseWriter, r *http.Request, path string, rb *reqBody, g *requests.GenRequest, start time.Time) {
	if up := batchUpstreamBytes(g, len(rb.b)); up > maxBatchUpstreamBytes {
		s.met.rejected.WithLabelValues("too_large").Inc()
		writeError(w, http.StatusRequestEntityTooLarge, codeTooLarge, fmt.Sprintf(
			"a batch of %d prompts is sent as one request per prompt, each carrying the body's other %d bytes: %d bytes in all exceed %d; send the prompts as separate requests or shrink the other fields",
			len(g.Batch), len(rb.b)-(g.PromptEnd-g.PromptStart), up, maxBatchUpstreamBytes))
		return
	}
	items := make([]batchItem, len(g.Batch))
	for i, it := range g.Batch {
		sub := *g
		sub.Batch, sub.Text, sub.Tokens = nil, it.Text, it.IDs
		items[i] = batchItem{g: &sub, body: newSplicedBody(rb, g.PromptStart, g.PromptEnd, g.PromptStart+it.Start, g.PromptStart+it.End)}
	}
	n := 1
	if g.N > 1 {
		n = g.N
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	out := make(chan batchMsg)
	var wg sync.WaitGroup
	sem := make(chan struct{}, maxBatchFanout)
	for i := range items {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer items[i].body.release()
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			defer func() { <-sem }()
			s.runBatchItem(ctx, r, path, &items[i], i, start, out)
		}()
	}
	go func() { wg.Wait(); close(out) }()
	if g.Stream {
		s.mergeStreams(w, out, len(items), n, cancel)
	} else {
		s.mergeJSON(w, out, len(items), n, cancel)
	}
	cancel()
	for range out { // join the prompts still running (they see ctx cancelled)
	}
}

// batchMsg is a sub-request's report: its response header (hdr), one SSE event (data), or its
// end (end, with the body of a non-streaming answer).
type batchMsg struct {
	idx    int
	hdr    bool
	end    bool
	status int
	header http.Header
	data   []byte
	body   []byte
}

// runBatchItem routes one prompt, reporting what it writes to out.
func (s *Server) runBatchItem(ctx context.Context, r *http.Request, path string, it *batchItem, idx int, start time.Time, out chan<- batchMsg) {
	cw := &captureWriter{ctx: ctx, idx: idx, out: out, header: http.Header{}}
	sw := httpstatus.Wrap(cw)
	lg := reqLog{endpoint: strings.TrimPrefix(path, "/v1/"), model: it.g.Model, stream: it.g.Stream, estimate: -1, cached: -1}
	defer func() {
		if p := recover(); p != nil && p != http.ErrAbortHandler {
			panic(p)
		} else if p != nil {
			cw.aborted = true
		}
		s.logRequest(ctx, &lg, sw.Status(), time.Since(start))
		cw.finish()
	}()
	s.route(sw, r.WithContext(ctx), path, it.body, it.g, start, &lg)
}

// captureWriter is a sub-request's ResponseWriter: it reports the header and, for streams, each
// SSE event as it completes; a non-streaming body is kept and reported at the end.
type captureWriter struct {
	ctx     context.Context
	idx     int
	out     chan<- batchMsg
	header  http.Header
	status  int
	sse     bool
	line    []byte // SSE line being assembled
	data    []byte // data of the SSE event being assembled
	body    bytes.Buffer
	aborted bool
}

func (c *captureWriter) send(m batchMsg) {
	m.idx = c.idx
	select {
	case c.out <- m:
	case <-c.ctx.Done():
	}
}

func (c *captureWriter) Header() http.Header { return c.header }

func (c *captureWriter) WriteHeader(status int) {
	if c.status != 0 {
		return
	}
	c.status = status
	c.sse = strings.HasPrefix(c.header.Get("Content-Type"), "text/event-stream")
	if c.sse {
		c.send(batchMsg{hdr: true, status: status, header: c.header.Clone()})
	}
}

func (c *captureWriter) Write(p []byte) (int, error) {
	if c.status == 0 {
		c.WriteHeader(http.StatusOK)
	}
	if c.ctx.Err() != nil {
		return 0, c.ctx.Err()
	}
	if !c.sse {
		return c.body.Write(p)
	}
	for rest := p; len(rest) > 0; {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			c.line = append(c.line, rest...)
			break
		}
		c.line = append(c.line, rest[:i]...)
		rest = rest[i+1:]
		line := bytes.TrimSuffix(c.line, []byte("\r"))
		if len(line) == 0 && c.data != nil {
			c.send(batchMsg{data: c.data})
			c.data = nil
		} else if d, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			d = bytes.TrimPrefix(d, []byte(" "))
			if c.data != nil {
				c.data = append(c.data, '\n')
			} else {
				c.data = make([]byte, 0, len(d))
			}
			c.data = append(c.data, d...)
		}
		c.line = c.line[:0]
	}
	return len(p), nil
}

// Flush is a no-op: events are handed over as they complete.
func (c *captureWriter) Flush() {}

func (c *captureWriter) finish() {
	status := c.status
	if c.aborted {
		status = http.StatusBadGateway
	}
	c.send(batchMsg{end: true, status: status, header: c.header, body: c.body.Bytes()})
}

// mergeJSON answers a non-streaming batch: the first failed prompt's answer if any failed, else
// one completion with every prompt's choices and the usage summed.
func (s *Server) mergeJSON(w http.ResponseWriter, in <-chan batchMsg, count, n int, cancel func()) {
	bodies := make([][]byte, count)
	for m := range in {
		if !m.end {
			continue
		}
		if m.status != http.StatusOK {
			cancel()
			relayCaptured(w, m)
			return
		}
		bodies[m.idx] = m.body
	}
	var env map[string]json.RawMessage
	var choices []json.RawMessage
	var u usageSum
	for i, b := range bodies {
		var r map[string]json.RawMessage
		if err := json.Unmarshal(b, &r); err != nil {
			writeError(w, http.StatusBadGateway, codeUpstream, "batch prompt "+strconv.Itoa(i)+": the engine's answer is not JSON")
			return
		}
		if env == nil {
			env = r
		}
		cs, err := reindex(r["choices"], i*n)
		if err != nil {
			writeError(w, http.StatusBadGateway, codeUpstream, "batch prompt "+strconv.Itoa(i)+": "+err.Error())
			return
		}
		choices = append(choices, cs...)
		u.add(r["usage"])
	}
	env["choices"], _ = json.Marshal(choices)
	if u.seen {
		env["usage"] = u.json()
	}
	b, _ := json.Marshal(env)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(b, '\n'))
}

// mergeStreams answers a streaming batch: one event stream carrying every prompt's chunks as
// they arrive, reindexed, with the prompts' usage chunks summed into one before [DONE].
func (s *Server) mergeStreams(w http.ResponseWriter, in <-chan batchMsg, count, n int, cancel func()) {
	rc := http.NewResponseController(w)
	started := false
	var u usageSum
	var usageEnv map[string]json.RawMessage
	event := func(b []byte) {
		_, _ = w.Write([]byte("data: "))
		_, _ = w.Write(b)
		_, _ = w.Write([]byte("\n\n"))
		_ = rc.Flush()
	}
	for m := range in {
		switch {
		case m.hdr && !started:
			for k, v := range m.header {
				if k == "Content-Type" || k == "Cache-Control" || k == "X-Accel-Buffering" {
					w.Header()[k] = v
				}
			}
			w.WriteHeader(http.StatusOK)
			_ = rc.Flush()
			started = true
		case m.end && m.status != http.StatusOK && !started:
			cancel()
			relayCaptured(w, m)
			return
		case m.end && m.status != http.StatusOK:
			// This prompt failed before streaming while others stream: an error event, as a
			// stream reports a failure once it has begun.
			var e struct {
				Error json.RawMessage `json:"error"`
			}
			if json.Unmarshal(m.body, &e) == nil && e.Error != nil {
				event(m.body)
			} else {
				writeSSEError(w, codeUpstream, "batch prompt "+strconv.Itoa(m.idx)+" failed with status "+strconv.Itoa(m.status))
			}
		case m.data != nil:
			if bytes.Equal(m.data, []byte("[DONE]")) {
				continue
			}
			var c map[string]json.RawMessage
			if json.Unmarshal(m.data, &c) != nil {
				event(m.data)
				continue
			}
			if raw, ok := c["usage"]; ok && !bytes.Equal(raw, []byte("null")) && isEmptyArray(c["choices"]) {
				u.add(raw)
				usageEnv = c
				continue
			}
			if cs, err := reindex(c["choices"], m.idx*n); err == nil && cs != nil {
				c["choices"], _ = json.Marshal(cs)
				b, _ := json.Marshal(c)
				event(b)
				continue
			}
			event(m.data)
		}
	}
	if !started {
		writeError(w, http.StatusBadGateway, codeUpstream, "no prompt of the batch answered")
		return
	}
	if usageEnv != nil {
		usageEnv["usage"] = u.json()
		b, _ := json.Marshal(usageEnv)
		event(b)
	}
	_, _ = w.Write([]byte("data: [DONE]\n\n"))
	_ = rc.Flush()
}

// relayCaptured writes a captured non-streaming answer (a failure) to the client.
func relayCaptured(w http.ResponseWriter, m batchMsg) {
	for k, v := range m.header {
		if !hopHeaders[k] && k != "Content-Length" {
			w.Header()[k] = v
		}
	}
	if (m.status == http.StatusTooManyRequests || m.status == http.StatusServiceUnavailable) && w.Header().Get("Retry-After") == "" {
		w.Header().Set("Retry-After", retryAfterSeconds)
	}
	w.WriteHeader(m.status)
	_, _ = w.Write(m.body)
}

func isEmptyArray(raw json.RawMessage) bool {
	return bytes.Equal(bytes.TrimSpace(raw), []byte("[]"))
}

// reindex shifts the "index" of every choice by off.
func reindex(raw json.RawMessage, off int) ([]json.RawMessage, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	var cs []map[string]json.RawMessage
	if err := json.Unmarshal(raw, &cs); err != nil {
		return nil, errors.New("choices is not an array of objects")
	}
	out := make([]json.RawMessage, len(cs))
	for i, c := range cs {
		var idx int
		_ = json.Unmarshal(c["index"], &idx)
		c["index"] = json.RawMessage(strconv.Itoa(idx + off))
		out[i], _ = json.Marshal(c)
	}
	return out, nil
}

// usageSum adds up the prompts' usage.
type usageSum struct {
	seen                                          bool
	prompt, completion, total, cached, hasDetails int
}

func (u *usageSum) add(raw json.RawMessage) {
	var v struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
		Details          *struct {
			Cached int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	}
	if len(raw) == 0 || json.Unmarshal(raw, &v) != nil {
		return
	}
	u.seen = true
	u.prompt += v.PromptTokens
	u.completion += v.CompletionTokens
	u.total += v.TotalTokens
	if v.Details != nil {
		u.hasDetails++
		u.cached += v.Details.Cached
	}
}

func (u *usageSum) json() json.RawMessage {
	v := map[string]any{"prompt_tokens": u.prompt, "completion_tokens": u.completion, "total_tokens": u.total}
	if u.hasDetails > 0 {
		v["prompt_tokens_details"] = map[string]int{"cached_tokens": u.cached}
	}
	b, _ := json.Marshal(v)
	return b
}
