package frontdoor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/prefixmesh/prefixmesh/internal/httpstatus"
	"github.com/prefixmesh/prefixmesh/internal/openai"
	"github.com/prefixmesh/prefixmesh/internal/tracing/spans"
	"github.com/prefixmesh/prefixmesh/local"
	"github.com/prefixmesh/prefixmesh/router/requests"
	"github.com/prefixmesh/prefixmesh/routing"
)

// maxAttempts is one try plus one retry on the next-best node: enough to ride over a node that
// died or restarted since the view last heard from it, without multiplying load when the whole
// fleet is failing.
const maxAttempts = 2

// Response headers the front door adds (beside the engine's own, requests.HeaderCachedTokens
// among them).
const (
	HeaderNode     = "X-Prefixmesh-Node"
	HeaderEstimate = "X-Prefixmesh-Estimated-Tokens"
	// HeaderEstimateTiers splits the estimate by tier ("gpu=128,cpu=256"), present when the
	// node's lower tiers add to its GPU prefix.
	HeaderEstimateTiers = "X-Prefixmesh-Estimated-Tiers"
)

// forwardHeaders are the request headers passed to the engine; the body is passed unchanged.
// Authorization is passed so engines that check an API key (vLLM --api-key) keep doing so.
var forwardHeaders = []string{"Content-Type", "Accept", "Authorization", "X-Request-Id", requests.HeaderSessionID, "Traceparent", "Tracestate"}

// hopHeaders are never copied from the engine's response (RFC 9110 §7.6.1). Content-Length is
// copied: the body is relayed byte for byte, and a body cut short aborts the connection.
var hopHeaders = map[string]bool{"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Te": true,
	"Trailer": true, "Transfer-Encoding": true, "Upgrade": true, "Proxy-Authenticate": true}

// retryAfterSeconds is the Retry-After of the 429s and 503s the router answers or relays without
// one (internal/openai's default: OpenAI's client libraries honour it).
const retryAfterSeconds = openai.DefaultRetryAfter

// reqLog is the one log line of a generation request, filled in as the request goes.
type reqLog struct {
	endpoint, model, node, policy, reason string
	stream                                bool
	promptTokens, estimate, cached        int
	retries                               int
	ttft                                  time.Duration
	err                                   string
	broken                                string // why a stream was cut after it began, "" if it was not
}

func (s *Server) serveGenerate(chat bool, path string) http.Handler {
	endpoint := strings.TrimPrefix(path, "/v1/")
	spanName := http.MethodPost + " " + path
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		lg := reqLog{endpoint: endpoint, estimate: -1, cached: -1}
		r, span := s.serverSpan(r, spanName, path)
		defer func() {
			status := httpstatus.ClientClosed
			if sw, ok := w.(*httpstatus.Writer); ok {
				status = sw.Status()
			}
			s.logRequest(r.Context(), &lg, status, time.Since(start))
			endServerSpan(span, status)
		}()
		// Admission: the in-flight bound, the body read under its size and time bounds, the
		// parse; the span ends before tokenising and deciding.
		_, adm := s.startSpan(r.Context(), spans.SpanAdmission, trace.SpanKindInternal)
		defer adm.End()
		if err := openai.CheckJSON(r.Header); err != nil {
			spanError(adm, "not a JSON request")
			s.writeErr(w, err, &lg)
			return
		}
		if err := s.svc.Enter(); err != nil {
			spanError(adm, err.Error())
			s.refuseAdmission(w, err)
			return
		}
		defer s.svc.Leave()
		s.met.inflight.Inc()
		defer s.met.inflight.Dec()

		rb, err := s.readBodyTimed(w, r)
		if err != nil {
			spanError(adm, "read request body")
			lg.err = err.Error()
			s.bodyError(w, err)
			return
		}
		defer rb.release()
		body := rb.b
		g, err := requests.ParseGen(body, chat, r.Header)
		if err != nil {
			spanError(adm, "invalid request")
			s.countTooLong(err)
			s.writeErr(w, err, &lg)
			return
		}
		admitted(adm, rb.size())
		g.Body = rb
		if g.Tokens != nil {
			// The prompt's ids are read only while the handler runs (parsing, routing:
			// Picker.Pick does not keep them).
			defer openai.ReleaseIDs(g.Tokens)
		}
		lg.model, lg.stream = g.Model, g.Stream
		if g.Batch != nil {
			lg.endpoint = "" // each prompt logs its own line
			s.serveBatch(w, r, path, rb, g, start)
			return
		}
		s.route(w, r, path, rb, g, start, &lg)
	})
}

// route tokenises a single-prompt request, picks its node and proxies it.
func (s *Server) route(w http.ResponseWriter, r *http.Request, path string, body *reqBody, g *requests.GenRequest, start time.Time, lg *reqLog) {
	base, adapter, err := s.svc.ResolveModel(g)
	if err != nil {
		s.writeErr(w, err, lg)
		return
	}
	if s.svc.FlowControl() {
		release, err := s.svc.AdmitFlow(r.Context(), base, r.Header)
		if err != nil {
			s.flowRefused(w, r, err, lg)
			return
		}
		// After the proxy has given back the decision's in-flight count (Pick.Done), so that
		// the requests this one's end releases see the capacity it freed.
		defer release()
	}
	toks, err := s.svc.PromptTokens(r.Context(), g, base)
	if err != nil {
		lg.err = err.Error()
		var he *openai.Error
		if errors.As(err, &he) {
			s.countTooLong(err)
			s.writeErr(w, err, lg)
		} else if errors.Is(err, requests.ErrNoNodes) {
			writeError(w, http.StatusServiceUnavailable, codeNoNodes, "no node can tokenise the prompt")
		} else if r.Context().Err() == nil {
			writeError(w, http.StatusBadGateway, codeTokenize, err.Error())
		}
		return
	}
	lg.promptTokens = len(toks)
	preq := &requests.PickRequest{Tokens: toks, AdapterID: adapter, Model: base, SessionKey: g.Session, Disaggregable: true}
	s.proxy(w, r, path, body, preq, g.Stream, start, lg)
}

// countTooLong counts a request refused for its prompt's size under rejected_total's too_large,
// with the bodies over the byte cap.
func (s *Server) countTooLong(err error) {
	if requests.IsTooLong(err) {
		s.met.rejected.WithLabelValues("too_large").Inc()
	}
}

// readBodyTimed reads the body into pooled buffers (body.go) under Config.BodyTimeout and the
// body budget, then lifts the deadline again (the response may stream for minutes); the caller
// releases it.
func (s *Server) readBodyTimed(w http.ResponseWriter, r *http.Request) (*reqBody, error) {
	rc := http.NewResponseController(w)
	// Not every ResponseWriter supports deadlines (httptest.ResponseRecorder does not): the
	// body is then bounded by its size only.
	_ = rc.SetReadDeadline(time.Now().Add(s.cfg.BodyTimeout))
	rb, err := readBodyPooled(w, r, s.cfg.MaxBodyBytes, s.svc.Bodies())
	if err == nil {
		_ = rc.SetReadDeadline(time.Time{})
	}
	return rb, err
}

// bodyError answers a request whose body could not be read, and counts the refusal.
func (s *Server) bodyError(w http.ResponseWriter, err error) {
	var mb *http.MaxBytesError
	var ne net.Error
	switch {
	case errors.As(err, &mb):
		s.met.rejected.WithLabelValues("too_large").Inc()
		// The rest of the body is not read: the connection cannot carry another request.
		w.Header().Set("Connection", "close")
		writeError(w, http.StatusRequestEntityTooLarge, codeTooLarge, fmt.Sprintf("request body exceeds %d bytes", mb.Limit))
	case errors.Is(err, errBodyBudget):
		// 429, not 503: the router is busy, not down; it is the in-flight bound's answer, the
		// one the endpoint picker gives for its own body budget, and what OpenAI's clients
		// retry after Retry-After.
		s.met.rejected.WithLabelValues(reasonBodyBudget).Inc()
		w.Header().Set("Connection", "close")
		w.Header().Set("Retry-After", retryAfterSeconds)
		writeError(w, http.StatusTooManyRequests, codeOverloaded,
			fmt.Sprintf("the router holds %d bytes of request bodies, its limit; retry later", s.svc.Bodies().Limit()))
	case errors.As(err, &ne) && ne.Timeout():
		s.met.rejected.WithLabelValues("body_timeout").Inc()
		w.Header().Set("Connection", "close")
		writeError(w, http.StatusRequestTimeout, codeBodyTimeout,
			fmt.Sprintf("the request body did not arrive within %v", s.cfg.BodyTimeout))
	default:
		writeError(w, http.StatusBadRequest, codeInvalid, "read request body: "+err.Error())
	}
}

// writeErr writes an *httpError with its status, anything else as a 500.
func (s *Server) writeErr(w http.ResponseWriter, err error, lg *reqLog) {
	lg.err = err.Error()
	var he *openai.Error
	if errors.As(err, &he) {
		openai.WriteError(w, he)
		return
	}
	writeError(w, http.StatusInternalServerError, "internal_error", err.Error())
}

// failure is an attempt that failed before anything reached the client: a transport error or
// deadline, or a 429 or 5xx whose (bounded) answer is kept to relay if no retry succeeds.
type failure struct {
	node   string
	err    error
	status int
	header http.Header
	body   []byte
}

// Retry causes (the label of retries_total).
const (
	causeConnect      = "connect"
	causeFirstByte    = "first_byte_timeout"
	causeStatus429    = "status_429"
	causeStatus5xx    = "status_5xx"
	causeIdle         = "idle_timeout"
	causeDrain        = "drain"
	causeUpstreamTime = "upstream_timeout"
	causeUpstream     = "upstream_error"
	causeClient       = "client_closed"
)

// proxy routes and forwards one request, retrying once on the next-best node when the first
// attempt fails before any byte reached the client: a connect error, no response headers within
// the first-byte deadline (streams), a 429 or a 5xx.
func (s *Server) proxy(w http.ResponseWriter, r *http.Request, path string, body *reqBody, preq *requests.PickRequest, stream bool, start time.Time, lg *reqLog) {
	ctx := r.Context()
	// One copy buffer for the request: the first bytes of a stream are read into it, and the
	// relay goes on with it.
	bp := relayBufs.Get().(*[]byte)
	defer relayBufs.Put(bp)
	var exclude []string
	var last *failure
	cause := ""
	for attempt := 0; attempt < maxAttempts; attempt++ {
		pk, err := s.svc.Pick(ctx, preq, exclude, attempt+1)
		if err != nil {
			if last != nil {
				break // no other node: relay the failure we have
			}
			lg.err = err.Error()
			if errors.Is(err, requests.ErrOverloaded) {
				s.met.rejected.WithLabelValues("overloaded").Inc()
				w.Header().Set("Retry-After", retryAfterSeconds)
				writeError(w, http.StatusTooManyRequests, codeOverloaded, "every node that can serve this request is at its load bound; retry later")
			} else {
				writeError(w, http.StatusServiceUnavailable, codeNoNodes, "no node can serve this request: "+err.Error())
			}
			return
		}
		if attempt > 0 {
			s.met.retries.WithLabelValues(cause).Inc()
			lg.retries++
		}
		s.met.decisions.WithLabelValues(pk.NodeID, pk.Policy, pk.Reason).Inc()
		lg.node, lg.policy, lg.reason, lg.estimate = pk.NodeID, pk.Policy, pk.Reason, pk.EstimatedMatchedTokens

		// A disaggregated request's prefill leg goes first (NIXL) or beside (SGLang), pd.go.
		var pd *pdLegs
		actx, send, hdr := ctx, requests.Body(body), r.Header
		if pk.Prefill != nil {
			var refused *failure
			pd, actx, refused = s.beginPD(ctx, r.Header, path, body.b, &pk)
			if refused != nil {
				pk.Done(requests.Outcome{Status: refused.status, CachedTokens: -1, Latency: time.Since(start)})
				lg.err = fmt.Sprintf("prefill node %s answered %d", refused.node, refused.status)
				s.writeFailure(w, refused)
				return
			}
			hdr = pd.header
			if pd.body != nil {
				send = pd.body
			}
		} else if src := pk.PeerSource; src != nil {
			if b, h, ok := peerPull(r.Header, body.b, src); ok {
				send, hdr = b, h
				s.met.peerPulls.Inc()
			}
		}
		at := s.startUpstream(actx, &pk, attempt+1)
		var fb *time.Timer
		if stream {
			fb = at.watchdog(s.firstByteTimeout(pk), errFirstByteTimeout)
		}
		resp, err := s.send(at.ctx, pk, path, send, hdr)
		if err == nil {
			at.upstreamStatus(resp.StatusCode)
		}
		var first []byte
		if fb != nil && err == nil && resp.StatusCode < 300 {
			// The first byte of the body, under the same deadline: an engine may send its
			// headers at once and stall after (vLLM starts its stream before the engine core
			// answers), and until a byte has been relayed the request can still go elsewhere.
			if first, err = readFirst(resp.Body, (*bp)[:firstReadBytes]); err != nil {
				resp.Body.Close()
				err = fmt.Errorf("node %s: before the first byte: %w", pk.NodeID, err)
			}
		}
		if fb != nil && !fb.Stop() && err == nil {
			resp.Body.Close() // the first byte raced the deadline and lost
			err = fmt.Errorf("node %s: %w", pk.NodeID, errFirstByteTimeout)
		}
		switch {
		case err == nil && (resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests):
			b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBodyBytes))
			resp.Body.Close()
			last = &failure{node: pk.NodeID, status: resp.StatusCode, header: resp.Header, body: b}
			err = fmt.Errorf("node %s answered %d", pk.NodeID, resp.StatusCode)
			cause = causeStatus5xx
			if resp.StatusCode == http.StatusTooManyRequests {
				cause = causeStatus429
			}
		case err != nil:
			last = &failure{node: pk.NodeID, err: err}
			cause = causeConnect
			if errors.Is(at.cause(), errFirstByteTimeout) {
				cause = causeFirstByte
				s.met.firstByteTimeouts.WithLabelValues(pk.NodeID).Inc()
			}
		}
		if err != nil {
			drained := errors.Is(at.cause(), errDrainCut)
			at.failed(err)
			at.end()
			pd.end(false)
			pk.Done(requests.Outcome{Status: last.status, Err: last.err, CachedTokens: -1, Latency: time.Since(start)})
			if ctx.Err() != nil {
				lg.err = "client went away"
				return // nothing to answer: the client is gone
			}
			lg.err = err.Error()
			if drained {
				w.Header().Set("Connection", "close")
				writeError(w, http.StatusServiceUnavailable, codeDraining, "the router is shutting down; retry on another replica")
				return
			}
			// A busy node (429) is healthy; a refused connect, a 5xx or a node that does not
			// answer in time is not, and the same streak ejects it.
			if cause != causeStatus429 && !prefillCut(actx) {
				s.svc.Health().ReportFailure(pk.NodeID)
			}
			exclude = append(exclude, pk.NodeID)
			continue
		}
		s.svc.Health().ReportSuccess(pk.NodeID)
		s.respond(w, resp, first, *bp, pk, pd, at, start, lg) // ends at and pd
		return
	}
	s.writeFailure(w, last)
}

// firstReadBytes is the most readFirst takes: one SSE event is a few hundred bytes.
const firstReadBytes = 4 << 10

// readFirst reads the first bytes of an upstream body into buf (an EOF after some is fine: the
// body is that short).
func readFirst(body io.Reader, buf []byte) ([]byte, error) {
	for {
		n, err := body.Read(buf)
		if n > 0 {
			return buf[:n], nil
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil, nil
			}
			return nil, err
		}
	}
}

// send forwards body (the client's, or a disaggregated leg's) to the chosen engine.
func (s *Server) send(ctx context.Context, pk requests.Pick, path string, body requests.Body, h http.Header) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, pk.EngineURL+path, nil)
	if err != nil {
		return nil, fmt.Errorf("build upstream request: %w", err)
	}
	body.Attach(req)
	for _, k := range forwardHeaders {
		if v := h.Values(k); len(v) > 0 {
			req.Header[k] = v
		}
	}
	if req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	s.injectTrace(ctx, req.Header)
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", pk.NodeID, err)
	}
	return resp, nil
}

// respond relays an upstream answer (any status below 500 but 429) to the client and records
// the outcome. A stream that goes quiet for StreamIdleTimeout is cut; a stream cut by the
// engine, a deadline or the drain ends with an SSE error event and a WARN line. It ends the
// attempt, deferred: a plain body cut after it began leaves by the abort panic, and an attempt
// not ended keeps its hook on the server's stop context (and its timers) until shutdown.
func (s *Server) respond(w http.ResponseWriter, resp *http.Response, first, buf []byte, pk requests.Pick, pd *pdLegs, at *attempt, start time.Time, lg *reqLog) {
	defer at.end()
	var rerr error
	defer func() { pd.end(rerr == nil) }()
	// The engine's Content-Type, not the request's stream flag, decides how to relay: an engine
	// may answer an error as JSON to a streaming request.
	defer resp.Body.Close()
	headerAt := time.Since(start)
	isSSE := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	var src io.Reader = resp.Body
	estimate := pk.EstimatedMatchedTokens
	if pd != nil && pd.local {
		pd = nil // the decode node prefilled: an ordinary answer (pd's leg is over)
	}
	if pd != nil {
		// The client is told what the prefill leg's cache saved, and that node's estimate.
		src, first = pd.rewriteAnswer(resp, first, isSSE)
		estimate = pd.leg.EstimatedMatchedTokens
	}
	for k, v := range resp.Header {
		if !hopHeaders[k] {
			w.Header()[k] = v
		}
	}
	w.Header().Set(HeaderNode, pk.NodeID)
	w.Header().Set(HeaderEstimate, strconv.Itoa(estimate))
	if pd != nil {
		w.Header().Set(HeaderPrefillNode, pd.leg.NodeID)
	} else if pk.EstimatedTiers.Lower() > 0 {
		w.Header().Set(HeaderEstimateTiers, tierHeader(&pk.EstimatedTiers))
	}
	if resp.StatusCode == http.StatusServiceUnavailable && w.Header().Get("Retry-After") == "" {
		w.Header().Set("Retry-After", retryAfterSeconds)
	}
	cached := -1
	if c, err := strconv.Atoi(resp.Header.Get(requests.HeaderCachedTokens)); err == nil {
		cached = c
	}
	w.WriteHeader(resp.StatusCode)
	if isSSE {
		_ = http.NewResponseController(w).Flush()
	}
	if !isSSE {
		at.firstByte.End() // the answer's first byte came with its headers
	}
	obs := requests.NewObserver(isSSE, start, cached, at.onFirstToken(pd.onFirstToken(pk.FirstToken, isSSE)))
	idle := at.watchdog(s.cfg.StreamIdleTimeout, errIdleTimeout)
	rerr = relay(w, src, first, buf, obs, func() { idle.Reset(s.cfg.StreamIdleTimeout) })
	ttft := obs.TTFT()
	if !isSSE {
		ttft = headerAt
	}
	lg.cached, lg.ttft = obs.Cached(), ttft
	pk.Done(requests.Outcome{Status: resp.StatusCode, CachedTokens: obs.Cached(), TTFT: ttft, Latency: time.Since(start)})
	if resp.StatusCode == http.StatusOK {
		if ttft > 0 {
			s.met.ttft.Observe(ttft.Seconds())
			s.met.accuracy.ObservePredictedTTFT(pk.ExpectedTTFT)
		}
		s.met.accuracy.Observe(estimate, obs.Cached(), lg.promptTokens)
	}
	if rerr == nil {
		return
	}
	cause, code := causeUpstream, codeUpstream
	msg := fmt.Sprintf("node %s broke off the stream: %v", pk.NodeID, rerr)
	switch c := at.cause(); {
	case errors.Is(rerr, errClientGone) || errors.Is(c, context.Canceled) && clientGone(resp):
		s.met.brokenStreams.WithLabelValues(pk.NodeID, causeClient).Inc()
		markBroken(w, causeClient)
		lg.err = "client went away"
		return
	case errors.Is(c, errIdleTimeout):
		cause, msg = causeIdle, fmt.Sprintf("node %s sent nothing for %v; the stream was cut", pk.NodeID, s.cfg.StreamIdleTimeout)
		s.svc.Health().ReportFailure(pk.NodeID)
	case errors.Is(c, errDrainCut):
		cause, code, msg = causeDrain, codeDraining, "the router shut down before the stream finished; retry on another replica"
	case errors.Is(c, errUpstreamTimeout):
		cause, msg = causeUpstreamTime, fmt.Sprintf("the request exceeded the router's upstream timeout of %v", s.cfg.UpstreamTimeout)
	default:
		s.svc.Health().ReportFailure(pk.NodeID)
	}
	spanError(at.span, msg)
	// Too late to retry: bytes reached the client. End a stream with an error event; abort a
	// plain body's connection so the client sees a failure, not a short body.
	s.met.brokenStreams.WithLabelValues(pk.NodeID, cause).Inc()
	markBroken(w, cause)
	lg.err, lg.broken = msg, cause
	if isSSE && !obs.Done() {
		writeSSEError(w, code, msg)
		return
	}
	if !isSSE {
		s.logRequest(context.Background(), lg, resp.StatusCode, time.Since(start))
		lg.endpoint = "" // logged already
		panic(http.ErrAbortHandler)
	}
}

// clientGone reports whether the request to the engine ended because the client went away (its
// context is the client's request context, or derived from it).
func clientGone(resp *http.Response) bool {
	return errors.Is(context.Cause(resp.Request.Context()), context.Canceled)
}

// writeFailure relays the last failed attempt: the engine's own 5xx answer, or 502.
// outcomeComplete is requests_total's outcome for a response that was not cut after it began.
const outcomeComplete = "complete"

// markBroken tells the instrumenting writer (when w is one) that the response was cut after it
// began, so requests_total counts it under its cause rather than as a plain 200.
func markBroken(w http.ResponseWriter, cause string) {
	if m, ok := w.(interface{ MarkBroken(string) }); ok {
		m.MarkBroken(cause)
	}
}

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
		if f.status == http.StatusTooManyRequests || f.status == http.StatusServiceUnavailable {
			ra := f.header.Get("Retry-After")
			if ra == "" {
				ra = retryAfterSeconds
			}
			w.Header().Set("Retry-After", ra)
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
	if status >= 500 || lg.broken != "" {
		level = slog.LevelWarn
	}
	if !s.log.Enabled(ctx, level) {
		return // the line's attributes are not built for a discarded line
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
	if lg.broken != "" {
		attrs = append(attrs, slog.String("broken", lg.broken))
	}
	if id := s.traceID(ctx); id != "" {
		attrs = append(attrs, slog.String("trace_id", id))
	}
	s.log.LogAttrs(ctx, level, "request", attrs...)
}

// tierHeader writes an estimate's nonzero tiers as "gpu=128,cpu=256" (the GPU always first).
func tierHeader(t *routing.TierTokens) string {
	var b [96]byte
	out := b[:0]
	for tier, n := range t {
		if n == 0 && tier != int(local.TierGPU) {
			continue
		}
		if len(out) > 0 {
			out = append(out, ',')
		}
		out = append(out, local.Tier(tier).String()...)
		out = append(out, '=')
		out = strconv.AppendInt(out, int64(n), 10)
	}
	return string(out)
}
