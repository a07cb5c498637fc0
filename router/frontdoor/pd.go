package frontdoor

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/prefixmesh/prefixmesh/cluster"
	"github.com/prefixmesh/prefixmesh/router/requests"
)

// A disaggregated request's legs (docs/disaggregation.md, "The doors"), driven the
// way the upstream proxies drive them so that unmodified engines serve them:
//
//   - NIXL (vLLM's NixlConnector): the prefill leg first, its body the client's with
//     kv_transfer_params.do_remote_decode, one token and no stream (requests.NIXLPrefillBody);
//     then the decode leg, the client's body with the prefill answer's kv_transfer_params copied
//     unchanged. Both legs carry the same X-Request-Id. The prefill leg is retried once on 502,
//     503, 504 or a transport error, as llm-d's sidecar retries it; when it still fails, or
//     answers without kv_transfer_params, the decode engine prefills the prompt itself (counted,
//     never the client's error). Any other error status is the client's answer, with the
//     prefill engine's body, as llm-d answers it.
//   - SGLang: both legs at once with the same body (bootstrap host, port and room,
//     requests.SGLangBody); the decode leg's answer is the client's, and either leg's failure
//     fails the other, as SGLang's gateway joins them.
//
// The client sees one ordinary answer from the decode node, with usage's cached_tokens taken
// from the prefill leg (a decode engine reports every pulled token as cached).

// HeaderPrefillNode names the node that ran a disaggregated request's prefill.
const HeaderPrefillNode = "X-Prefixmesh-Prefill-Node"

// maxPrefillAnswerBytes bounds a prefill leg's answer: one token and the transfer parameters.
const maxPrefillAnswerBytes = 1 << 20

// prefillTries is the prefill leg's first try and its one retry.
const prefillTries = 2

// Outcomes of a prefill leg (pd_prefill_legs_total).
const (
	prefillOK       = "ok"
	prefillNoParams = "no_kv_transfer_params" // the decode engine prefilled locally
	prefillFailed   = "failed"                // the decode engine prefilled locally
	prefillRefused  = "refused"               // its error answer went to the client
	prefillAborted  = "aborted"               // the decode leg ended first (SGLang)
)

// errPrefillLeg cancels an SGLang decode leg whose prefill leg failed.
var errPrefillLeg = errors.New("the prefill leg failed")

// pdLegs is one attempt's disaggregation.
type pdLegs struct {
	s      *Server
	leg    *requests.PrefillLeg
	header http.Header   // the client's headers with the request id both legs carry
	body   requests.Body // the decode leg's body; nil sends the client's
	// cached is the prefill leg's cached_tokens, -1 while unknown. Under SGLang it is written
	// by the prefill leg's goroutine before done closes.
	cached   int
	answered time.Time // when a NIXL prefill leg answered; zero under SGLang or a local prefill
	// local: the prefill leg failed or gave no kv_transfer_params, and the decode node
	// prefills the prompt itself: the answer is an ordinary one from it.
	local bool

	// SGLang's concurrent prefill leg.
	done         chan struct{}
	cancelLeg    context.CancelFunc
	cancelDecode context.CancelCauseFunc
}

// beginPD starts the request's prefill leg (NIXL: runs it to its answer) and returns the decode
// leg's setup, or a failure to relay to the client (the prefill engine's error answer). ctx is
// the decode leg's context for SGLang (cancelled when the prefill leg fails).
func (s *Server) beginPD(ctx context.Context, h http.Header, path string, raw []byte, pk *requests.Pick) (*pdLegs, context.Context, *failure) {
	pd := &pdLegs{s: s, leg: pk.Prefill, header: withRequestID(h), cached: -1}
	if pk.Prefill.Connector == cluster.KVConnectorSGLang {
		return pd, pd.startSGLang(ctx, path, raw), nil
	}
	return pd, ctx, pd.runNIXL(ctx, path, raw)
}

// peerPull sets up a request whose node pulls the prompt's prefix from a peer (Pick.PeerSource):
// the client's body with kv_transfer_params.remote_kv_source naming the peer, as llm-d's sidecar
// writes it, and the request id it names. ok is false when the body cannot carry it (the
// request then goes as the client sent it, and the node recomputes).
func peerPull(h http.Header, raw []byte, src *requests.PeerSource) (body requests.Body, header http.Header, ok bool) {
	host, p, err := net.SplitHostPort(src.Addr)
	port, perr := strconv.Atoi(p)
	if err != nil || perr != nil {
		return nil, nil, false
	}
	header = withRequestID(h)
	b, err := requests.PeerPullBody(raw, header.Get("X-Request-Id"), host, port)
	if err != nil {
		return nil, nil, false
	}
	return requests.BytesBody(b), header, true
}

// withRequestID returns h with an X-Request-Id, h's own or a new one, so both legs carry it.
func withRequestID(h http.Header) http.Header {
	out := h.Clone()
	if out.Get("X-Request-Id") == "" {
		var b [16]byte
		_, _ = rand.Read(b[:])
		out.Set("X-Request-Id", hex.EncodeToString(b[:]))
	}
	return out
}

// runNIXL sends the prefill leg until it answers and sets up the decode leg: its body with the
// answer's kv_transfer_params, or the client's when the decode engine is to prefill locally.
func (pd *pdLegs) runNIXL(ctx context.Context, path string, raw []byte) *failure {
	s, leg := pd.s, pd.leg
	body, err := requests.NIXLPrefillBody(raw)
	if err != nil { // the client's body is an object the parser accepted: not reached
		pd.local = true
		pd.finishLeg(prefillFailed, requests.Outcome{Err: err, CachedTokens: -1})
		return nil
	}
	start := time.Now()
	var lastErr error
	for try := 0; try < prefillTries; try++ {
		ans, status, hdr, err := pd.post(ctx, path, requests.BytesBody(body))
		switch {
		case err != nil:
			if ctx.Err() != nil {
				pd.local = true
				pd.finishLeg(prefillAborted, requests.Outcome{Err: err, CachedTokens: -1, Latency: time.Since(start)})
				return nil
			}
			lastErr = err
			s.svc.Health().ReportFailure(leg.NodeID)
			continue
		case status == http.StatusBadGateway || status == http.StatusServiceUnavailable || status == http.StatusGatewayTimeout:
			lastErr = fmt.Errorf("prefill node %s answered %d", leg.NodeID, status)
			s.svc.Health().ReportFailure(leg.NodeID)
			continue
		case status >= 300:
			// The request's own fault, or the engine's: the client gets the engine's answer.
			pd.finishLeg(prefillRefused, requests.Outcome{Status: status, CachedTokens: -1, Latency: time.Since(start)})
			return &failure{node: leg.NodeID, status: status, header: hdr, body: ans}
		}
		s.svc.Health().ReportSuccess(leg.NodeID)
		pd.answered = time.Now()
		leg.FirstToken()
		if c, ok := requests.CachedTokens(ans); ok {
			pd.cached = c
		} else {
			pd.cached = 0 // llm-d's rule: a prefill answer without the count saved nothing
		}
		o := requests.Outcome{Status: status, CachedTokens: pd.cached, TTFT: pd.answered.Sub(start), Latency: pd.answered.Sub(start)}
		params, ok := requests.KVTransferParams(ans)
		if ok {
			pd.body, err = decodeBody(raw, params)
		}
		if !ok || err != nil {
			// The decode engine prefills the prompt itself, and its own count is the truth.
			pd.answered, pd.cached, pd.local = time.Time{}, -1, true
			pd.finishLeg(prefillNoParams, o)
			return nil
		}
		pd.finishLeg(prefillOK, o)
		return nil
	}
	pd.cached, pd.local = -1, true
	pd.finishLeg(prefillFailed, requests.Outcome{Err: lastErr, CachedTokens: -1, Latency: time.Since(start)})
	return nil
}

// prefillCut reports whether ctx, a decode leg's, was cancelled by its SGLang prefill leg's
// failure: the decode node did nothing wrong.
func prefillCut(ctx context.Context) bool { return errors.Is(context.Cause(ctx), errPrefillLeg) }

func decodeBody(raw, params []byte) (requests.Body, error) {
	b, err := requests.NIXLDecodeBody(raw, params)
	if err != nil {
		return nil, err
	}
	return requests.BytesBody(b), nil
}

// post sends one prefill leg and reads its (bounded) answer.
func (pd *pdLegs) post(ctx context.Context, path string, body requests.Body) ([]byte, int, http.Header, error) {
	s, leg := pd.s, pd.leg
	ctx, cancel := context.WithTimeout(ctx, s.cfg.FirstByteCeiling)
	defer cancel()
	resp, err := s.send(ctx, requests.Pick{NodeID: leg.NodeID, EngineURL: leg.EngineURL}, path, body, pd.header)
	if err != nil {
		return nil, 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxPrefillAnswerBytes))
	if err != nil {
		return nil, 0, nil, fmt.Errorf("prefill node %s: read answer: %w", leg.NodeID, err)
	}
	return b, resp.StatusCode, resp.Header, nil
}

// finishLeg ends the prefill leg's ticket and counts its outcome.
func (pd *pdLegs) finishLeg(outcome string, o requests.Outcome) {
	pd.s.met.prefillLegs.WithLabelValues(outcome).Inc()
	pd.leg.Done(o)
}

// startSGLang starts the prefill leg beside the decode leg, both with the bootstrap body, and
// returns the decode leg's context, which the prefill leg's failure cancels.
func (pd *pdLegs) startSGLang(ctx context.Context, path string, raw []byte) context.Context {
	host := bootstrapHost(pd.leg.EngineURL)
	var room [8]byte
	_, _ = rand.Read(room[:])
	r := uint64(room[0])<<56 | uint64(room[1])<<48 | uint64(room[2])<<40 | uint64(room[3])<<32 |
		uint64(room[4])<<24 | uint64(room[5])<<16 | uint64(room[6])<<8 | uint64(room[7])
	b, err := requests.SGLangBody(raw, host, int(pd.leg.BootstrapPort), r&(1<<63-1)) // mini_lb: randint(0, 2**63-1)
	if err != nil {
		pd.finishLeg(prefillFailed, requests.Outcome{Err: err, CachedTokens: -1})
		return ctx
	}
	pd.body = requests.BytesBody(b)
	dctx, cancelDecode := context.WithCancelCause(ctx)
	lctx, cancelLeg := context.WithCancel(ctx)
	pd.cancelDecode, pd.cancelLeg, pd.done = cancelDecode, cancelLeg, make(chan struct{})
	go func() {
		defer close(pd.done)
		start := time.Now()
		ans, status, _, err := pd.post(lctx, path, pd.body)
		o := requests.Outcome{Status: status, Err: err, CachedTokens: -1, Latency: time.Since(start)}
		switch {
		case err != nil && lctx.Err() != nil:
			pd.finishLeg(prefillAborted, o)
		case err != nil || status >= 300:
			s := pd.s
			if err == nil {
				err = fmt.Errorf("prefill node %s answered %d", pd.leg.NodeID, status)
			}
			s.svc.Health().ReportFailure(pd.leg.NodeID)
			cancelDecode(fmt.Errorf("%w: %w", errPrefillLeg, err))
			pd.finishLeg(prefillFailed, o)
		default:
			pd.s.svc.Health().ReportSuccess(pd.leg.NodeID)
			pd.cached = 0
			if c, ok := requests.CachedTokens(ans); ok {
				pd.cached = c
			}
			o.CachedTokens, o.TTFT = pd.cached, o.Latency
			pd.leg.FirstToken()
			pd.finishLeg(prefillOK, o)
		}
	}()
	return dctx
}

// bootstrapHost is the prefill engine's host for SGLang's bootstrap_host: its URL's host, an
// IPv6 address in brackets as SGLang's mini load balancer writes it.
func bootstrapHost(engineURL string) string {
	u, err := url.Parse(engineURL)
	if err != nil {
		return ""
	}
	h := u.Hostname()
	if ip := net.ParseIP(h); ip != nil && ip.To4() == nil {
		return "[" + h + "]"
	}
	return h
}

// end ends the attempt's disaggregation: an SGLang prefill leg still running is cancelled when
// the decode leg failed and waited for either way, so its ticket is done when the attempt is.
func (pd *pdLegs) end(decodeOK bool) {
	if pd == nil || pd.done == nil {
		return
	}
	if !decodeOK {
		pd.cancelLeg()
	}
	<-pd.done
	pd.cancelLeg()
	pd.cancelDecode(nil)
}

// cachedNow is the prefill leg's cached_tokens if it is known now (-1 otherwise: an SGLang
// prefill leg still running).
func (pd *pdLegs) cachedNow() int {
	if pd.done == nil {
		return pd.cached
	}
	select {
	case <-pd.done:
		return pd.cached
	default:
		return -1
	}
}

// cachedWait is the prefill leg's cached_tokens once it has answered (an SGLang leg is waited
// for: its post is bounded by the first-byte ceiling), -1 when it did not say.
func (pd *pdLegs) cachedWait() int {
	if pd.done != nil {
		<-pd.done
	}
	return pd.cached
}

// onFirstToken wraps the decode leg's first-token hook: a stream's first token after a NIXL
// prefill leg's answer times the transfer (with the decode engine's queue and first step),
// which teaches the router's transfer fit.
func (pd *pdLegs) onFirstToken(first func(), stream bool) func() {
	if pd == nil || pd.answered.IsZero() || !stream {
		return first
	}
	return func() {
		pd.leg.ObserveTransfer(time.Since(pd.answered))
		if first != nil {
			first()
		}
	}
}

// rewriteAnswer makes the decode answer's usage say the prefill leg's cached_tokens (the decode
// engine counts every pulled token as cached), as llm-d's sidecar does: a JSON body is read
// whole (bounded) and rewritten, a stream event by event. It returns the body to relay, with
// first (bytes already read) folded in.
func (pd *pdLegs) rewriteAnswer(resp *http.Response, first []byte, isSSE bool) (io.Reader, []byte) {
	if pd.done == nil && pd.cached < 0 {
		return resp.Body, first // no prefill answer to take the count from: the decode prefilled
	}
	if isSSE {
		// The count is read when the usage event comes (after the prefill leg answered: the
		// decode engine had to wait for its KV); the header says it only if it is known now.
		if c := pd.cachedNow(); c >= 0 {
			resp.Header.Set(requests.HeaderCachedTokens, strconv.Itoa(c))
		} else {
			resp.Header.Del(requests.HeaderCachedTokens)
		}
		src := io.Reader(resp.Body)
		if len(first) > 0 {
			src = io.MultiReader(bytes.NewReader(bytes.Clone(first)), resp.Body)
		}
		return &sseCachedRewriter{src: src, cached: pd.cachedWait}, nil
	}
	cached := pd.cachedWait()
	if cached < 0 {
		return resp.Body, first
	}
	resp.Header.Set(requests.HeaderCachedTokens, strconv.Itoa(cached))
	// The whole body, with the bytes a streaming request's first read took.
	b, err := io.ReadAll(io.LimitReader(io.MultiReader(bytes.NewReader(bytes.Clone(first)), resp.Body), maxRewriteBytes+1))
	first = nil
	if err != nil || len(b) > maxRewriteBytes {
		// Relay as it comes: what was read, then the rest (or the read error).
		return io.MultiReader(bytes.NewReader(b), resp.Body), first
	}
	if out, ok := requests.RewriteCachedTokens(b, cached); ok {
		b = out
		resp.Header.Set("Content-Length", strconv.Itoa(len(b)))
	}
	return bytes.NewReader(b), first
}

// maxRewriteBytes bounds a JSON decode answer read whole to rewrite it; a larger one is relayed
// as the engine wrote it.
const maxRewriteBytes = 8 << 20

// sseCachedRewriter relays an SSE stream event by event, rewriting cached_tokens in the events
// that carry usage. An event longer than maxRewriteBytes is relayed as it is.
type sseCachedRewriter struct {
	src    io.Reader
	cached func() int // read at the first event that carries usage
	pend   []byte     // read, not yet a whole event
	out    []byte     // ready to relay
	err    error
	buf    [4 << 10]byte
}

func (r *sseCachedRewriter) Read(p []byte) (int, error) {
	for len(r.out) == 0 {
		if r.err != nil {
			if len(r.pend) > 0 {
				r.out, r.pend = r.pend, nil
				break
			}
			return 0, r.err
		}
		n, err := r.src.Read(r.buf[:])
		r.pend = append(r.pend, r.buf[:n]...)
		r.err = err
		r.events()
	}
	n := copy(p, r.out)
	r.out = r.out[n:]
	return n, nil
}

// events moves the whole events in pend to out, rewritten.
func (r *sseCachedRewriter) events() {
	for {
		i := bytes.Index(r.pend, []byte("\n\n"))
		if i < 0 {
			if len(r.pend) > maxRewriteBytes {
				r.out, r.pend = append(r.out, r.pend...), r.pend[:0]
			}
			return
		}
		ev := r.pend[:i+2]
		r.out = append(r.out, r.rewriteEvent(ev)...)
		r.pend = r.pend[i+2:]
	}
}

// rewriteEvent rewrites the data line of one SSE event when it carries usage's cached tokens.
func (r *sseCachedRewriter) rewriteEvent(ev []byte) []byte {
	if !bytes.Contains(ev, []byte(`"prompt_tokens_details"`)) {
		return ev
	}
	cached := r.cached()
	if cached < 0 {
		return ev
	}
	var out []byte
	for line := range bytes.Lines(ev) {
		payload, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			out = append(out, line...)
			continue
		}
		body := bytes.TrimSpace(payload)
		rw, ok := requests.RewriteCachedTokens(body, cached)
		if !ok {
			out = append(out, line...)
			continue
		}
		out = append(out, "data: "...)
		out = append(out, rw...)
		out = append(out, '\n')
	}
	return out
}
