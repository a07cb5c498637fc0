package frontdoor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prefixmesh/prefixmesh/internal/httpstatus"
)

// maxAttempts is one try plus one retry on the next-best node: enough to ride over a node that
// died or restarted since the view last heard from it, without multiplying load when the whole
// fleet is failing.
const maxAttempts = 2

// forwardHeaders are the request headers passed to the engine; the body is passed unchanged.
// Authorization is passed so engines that check an API key (vLLM --api-key) keep doing so.
var forwardHeaders = []string{"Content-Type", "Accept", "Authorization", "X-Request-Id", HeaderSessionID, "Traceparent", "Tracestate"}

// hopHeaders are never copied from the engine's response (RFC 9110 §7.6.1). Content-Length is
// copied: the body is relayed byte for byte, and a body cut short aborts the connection.
var hopHeaders = map[string]bool{"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Te": true,
	"Trailer": true, "Transfer-Encoding": true, "Upgrade": true, "Proxy-Authenticate": true}

// retryAfterSeconds is the Retry-After of a 429: OpenAI's client libraries honour it, and one
// second is several typical request lifetimes at the load where the router refuses work.
const retryAfterSeconds = "1"

// reqLog is the one log line of a generation request, filled in as the request goes.
type reqLog struct {
	endpoint, model, node, policy, reason string
	stream                                bool
	promptTokens, estimate, cached        int
	retries                               int
	ttft                                  time.Duration
	err                                   string
}

func (s *Server) serveGenerate(chat bool, path string) http.Handler {
	endpoint := strings.TrimPrefix(path, "/v1/")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		lg := reqLog{endpoint: endpoint, estimate: -1, cached: -1}
		defer func() {
			status := httpstatus.ClientClosed
			if sw, ok := w.(*httpstatus.Writer); ok {
				status = sw.Status()
			}
			s.logRequest(r.Context(), &lg, status, time.Since(start))
		}()
		if err := s.adm.enter(); err != nil {
			if errors.Is(err, ErrDraining) {
				s.met.rejected.WithLabelValues("draining").Inc()
				w.Header().Set("Connection", "close")
				writeError(w, http.StatusServiceUnavailable, codeDraining, "the router is shutting down; retry on another replica")
				return
			}
			s.met.rejected.WithLabelValues("overloaded").Inc()
			w.Header().Set("Retry-After", retryAfterSeconds)
			writeError(w, http.StatusTooManyRequests, codeOverloaded,
				fmt.Sprintf("the router has %d requests in flight, its limit; retry later", s.cfg.MaxInFlight))
			return
		}
		defer s.adm.leave()
		s.met.inflight.Inc()
		defer s.met.inflight.Dec()

		body, err := readBody(w, r, s.cfg.MaxBodyBytes)
		if err != nil {
			var mb *http.MaxBytesError
			if errors.As(err, &mb) {
				s.met.rejected.WithLabelValues("too_large").Inc()
				writeError(w, http.StatusRequestEntityTooLarge, codeTooLarge, fmt.Sprintf("request body exceeds %d bytes", mb.Limit))
				return
			}
			lg.err = err.Error()
			writeError(w, http.StatusBadRequest, codeInvalid, "read request body: "+err.Error())
			return
		}
		g, err := parseGen(body, chat, r.Header)
		if err != nil {
			s.writeErr(w, err, &lg)
			return
		}
		lg.model, lg.stream = g.model, g.stream
		base, adapter, err := resolveModel(s.picker.Models(), g.model, derefU64(g.adapterField), g.adapterField != nil)
		if err != nil {
			s.writeErr(w, err, &lg)
			return
		}
		toks, err := s.tok.tokens(r.Context(), g, base)
		if err != nil {
			lg.err = err.Error()
			var he *httpError
			if errors.As(err, &he) {
				s.writeErr(w, err, &lg)
			} else if errors.Is(err, ErrNoNodes) {
				writeError(w, http.StatusServiceUnavailable, codeNoNodes, "no node can tokenise the prompt")
			} else if r.Context().Err() == nil {
				writeError(w, http.StatusBadGateway, codeTokenize, err.Error())
			}
			return
		}
		lg.promptTokens = len(toks)
		preq := &PickRequest{Tokens: toks, AdapterID: adapter, Model: base, SessionKey: g.session}
		s.proxy(w, r, path, body, preq, start, &lg)
	})
}

// readBody reads the whole body, at most limit bytes (more is an *http.MaxBytesError), sized by
// Content-Length when the client sent one.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	var buf bytes.Buffer
	if r.ContentLength > 0 && r.ContentLength <= limit {
		buf.Grow(int(r.ContentLength) + 1) // +1: ReadFrom's final read finds EOF without growing
	}
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, limit))
	return buf.Bytes(), err
}

func derefU64(p *uint64) uint64 {
	if p == nil {
		return 0
	}
	return *p
}

// writeErr writes an *httpError with its status, anything else as a 500.
func (s *Server) writeErr(w http.ResponseWriter, err error, lg *reqLog) {
	lg.err = err.Error()
	var he *httpError
	if errors.As(err, &he) {
		writeError(w, he.status, he.code, he.msg)
		return
	}
	writeError(w, http.StatusInternalServerError, "internal_error", err.Error())
}

// failure is an attempt that failed before anything reached the client: a transport error, or a
// 5xx whose (bounded) answer is kept to relay if no retry succeeds.
type failure struct {
	node   string
	err    error
	status int
	header http.Header
	body   []byte
}

// proxy routes and forwards one request, retrying once on the next-best node when the first
// attempt fails before any byte reached the client.
func (s *Server) proxy(w http.ResponseWriter, r *http.Request, path string, body []byte, preq *PickRequest, start time.Time, lg *reqLog) {
	ctx := r.Context()
	var exclude []string
	var last *failure
	for attempt := 0; attempt < maxAttempts; attempt++ {
		pk, err := s.picker.Pick(ctx, preq, exclude)
		if err != nil {
			if last != nil {
				break // no other node: relay the failure we have
			}
			lg.err = err.Error()
			if errors.Is(err, ErrOverloaded) {
				s.met.rejected.WithLabelValues("overloaded").Inc()
				w.Header().Set("Retry-After", retryAfterSeconds)
				writeError(w, http.StatusTooManyRequests, codeOverloaded, "every node that can serve this request is at its load bound; retry later")
			} else {
				writeError(w, http.StatusServiceUnavailable, codeNoNodes, "no node can serve this request: "+err.Error())
			}
			return
		}
		if attempt > 0 {
			s.met.retries.Inc()
			lg.retries++
		}
		s.met.decisions.WithLabelValues(pk.NodeID, pk.Policy, pk.Reason).Inc()
		lg.node, lg.policy, lg.reason, lg.estimate = pk.NodeID, pk.Policy, pk.Reason, pk.EstimatedMatchedTokens

		actx, cancel := ctx, context.CancelFunc(func() {})
		if s.cfg.UpstreamTimeout > 0 {
			actx, cancel = context.WithTimeout(ctx, s.cfg.UpstreamTimeout)
		}
		resp, err := s.send(actx, pk, path, body, r.Header)
		if err == nil && resp.StatusCode >= 500 {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBodyBytes))
			resp.Body.Close()
			last = &failure{node: pk.NodeID, status: resp.StatusCode, header: resp.Header, body: b}
			err = fmt.Errorf("node %s answered %d", pk.NodeID, resp.StatusCode)
		} else if err != nil {
			last = &failure{node: pk.NodeID, err: err}
		}
		if err != nil {
			cancel()
			pk.Done(Outcome{Status: last.status, Err: last.err, CachedTokens: -1, Latency: time.Since(start)})
			if ctx.Err() != nil {
				lg.err = "client went away"
				return // nothing to answer: the client is gone
			}
			s.health.ReportFailure(pk.NodeID)
			lg.err = err.Error()
			exclude = append(exclude, pk.NodeID)
			continue
		}
		s.health.ReportSuccess(pk.NodeID)
		s.respond(w, resp, pk, start, lg)
		cancel()
		return
	}
	s.writeFailure(w, last)
}

// send forwards the original body to the chosen engine.
func (s *Server) send(ctx context.Context, pk Pick, path string, body []byte, h http.Header) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, pk.EngineURL+path, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("build upstream request: %w", err)
	}
	for _, k := range forwardHeaders {
		if v := h.Values(k); len(v) > 0 {
			req.Header[k] = v
		}
	}
	if req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", pk.NodeID, err)
	}
	return resp, nil
}

// respond relays an upstream answer (any status below 500) to the client and records the outcome.
func (s *Server) respond(w http.ResponseWriter, resp *http.Response, pk Pick, start time.Time, lg *reqLog) {
	// The engine's Content-Type, not the request's stream flag, decides how to relay: an engine
	// may answer an error as JSON to a streaming request.
	defer resp.Body.Close()
	headerAt := time.Since(start)
	for k, v := range resp.Header {
		if !hopHeaders[k] {
			w.Header()[k] = v
		}
	}
	w.Header().Set(HeaderNode, pk.NodeID)
	w.Header().Set(HeaderEstimate, strconv.Itoa(pk.EstimatedMatchedTokens))
	cached := -1
	if c, err := strconv.Atoi(resp.Header.Get(HeaderCachedTokens)); err == nil {
		cached = c
	}
	isSSE := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	w.WriteHeader(resp.StatusCode)
	if isSSE {
		_ = http.NewResponseController(w).Flush()
	}
	obs := newObserver(isSSE, start, cached, pk.FirstToken)
	rerr := relay(w, resp.Body, obs)
	ttft := obs.ttft
	if !isSSE {
		ttft = headerAt
	}
	lg.cached, lg.ttft = obs.cached, ttft
	pk.Done(Outcome{Status: resp.StatusCode, CachedTokens: obs.cached, TTFT: ttft, Latency: time.Since(start)})
	if resp.StatusCode == http.StatusOK {
		if ttft > 0 {
			s.met.ttft.Observe(ttft.Seconds())
		}
		if obs.cached >= 0 && pk.EstimatedMatchedTokens >= 0 {
			s.met.estimateSeen.Inc()
			diff := pk.EstimatedMatchedTokens - obs.cached
			if diff == 0 {
				s.met.estimateExact.Inc()
			}
			s.met.estimateError.Observe(float64(max(diff, -diff)))
		}
	}
	switch {
	case rerr == nil:
	case errors.Is(rerr, errClientGone) || clientGone(resp):
		lg.err = "client went away"
	default:
		// The upstream broke off after bytes reached the client: too late to retry. End a stream
		// with an error event; abort a plain body's connection so the client sees a failure, not
		// a short body.
		lg.err = "upstream broke off: " + rerr.Error()
		if resp.Request.Context().Err() == nil { // not our own UpstreamTimeout
			s.health.ReportFailure(pk.NodeID)
		}
		if isSSE && !obs.done {
			writeSSEError(w, codeUpstream, fmt.Sprintf("node %s broke off the stream: %v", pk.NodeID, rerr))
			return
		}
		if !isSSE {
			s.logRequest(context.Background(), lg, resp.StatusCode, time.Since(start))
			lg.endpoint = "" // logged already
			panic(http.ErrAbortHandler)
		}
	}
}

// clientGone reports whether the request to the engine ended because the client went away (its
// context is the client's request context, or derived from it).
func clientGone(resp *http.Response) bool {
	return errors.Is(context.Cause(resp.Request.Context()), context.Canceled)
}

// writeFailure relays the last failed attempt: the engine's own 5xx answer, or 502.
func (s *Server) writeFailure(w http.ResponseWriter, f *failure) {
	if f == nil {
		writeError(w, http.StatusServiceUnavailable, codeNoNodes, "no node can serve this request")
		return
	}
	w.Header().Set(HeaderNode, f.node)
	if f.status != 0 {
		if ct := f.header.Get("Content-Type"); ct != "" {
			w.Header().Set("Content-Type", ct)
		}
		w.WriteHeader(f.status)
		_, _ = w.Write(f.body)
		return
	}
	writeError(w, http.StatusBadGateway, codeUpstream, f.err.Error())
}

// logRequest writes the request's one line.
func (s *Server) logRequest(ctx context.Context, lg *reqLog, status int, latency time.Duration) {
	if lg.endpoint == "" {
		return
	}
	level := slog.LevelInfo
	if status >= 500 {
		level = slog.LevelWarn
	}
	attrs := []slog.Attr{
		slog.String("endpoint", lg.endpoint), slog.Int("status", status), slog.String("model", lg.model),
		slog.Bool("stream", lg.stream), slog.Int("prompt_tokens", lg.promptTokens),
		slog.String("node", lg.node), slog.String("policy", lg.policy), slog.String("reason", lg.reason),
		slog.Int("estimate", lg.estimate), slog.Int("cached_tokens", lg.cached),
		slog.Duration("ttft", lg.ttft), slog.Duration("latency", latency), slog.Int("retries", lg.retries),
	}
	if lg.err != "" {
		attrs = append(attrs, slog.String("err", lg.err))
	}
	s.log.LogAttrs(ctx, level, "request", attrs...)
}
