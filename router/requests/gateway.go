package requests

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prefixmesh/prefixmesh/internal/openai"
	"github.com/prefixmesh/prefixmesh/routing"
)

// GatewayRequest is a request that a gateway proxies itself and only asks the router where to
// send (the ext_proc endpoint picker, router/extproc): the same parse, tokenizer and Picker as
// the front door's requests, but nothing is proxied here and nothing is refused for its shape.
type GatewayRequest struct {
	Path   string      // the request's :path; a query string is ignored
	Header http.Header // read for X-Session-ID; may be nil
	Body   []byte      // the whole body; nil or empty for a request without one
	// Allowed, when not nil, is the node ids the picker may choose (a gateway's subset hint),
	// built once per request: PickRequest.Allowed.
	Allowed *routing.NodeSet
	// Alternates asks for up to this many next-best nodes (the gateway's fallback list).
	Alternates int
}

// GatewayPick is a decision taken for a gateway. The gateway's response passes through the
// caller, which shows it here (ResponseHeaders, ResponseBody) and ends it exactly once (End):
// that closes the loop as the front door's proxy does: the in-flight count, the overlay's
// pending prefix at the first token, the engine's cached_tokens and passive health. When the
// gateway says another node served (a fallback), that node owns the request from then on: the
// chosen node's count is given back as failed and the served node's begins (Pick.Reroute), so
// its load, first token and outcome are counted where the request really ran.
type GatewayPick struct {
	Pick
	// PromptTokens is the prompt's length in tokens, -1 when the request was routed by load
	// alone (no body, not an OpenAI generation request, or a prompt that cannot be tokenised
	// exactly here).
	PromptTokens int
	// Stream is the request's stream flag (false when the body was not parsed).
	Stream bool

	s     *Service
	start time.Time

	mu        sync.Mutex // guards everything below
	status    int
	headAt    time.Duration
	obs       *Observer
	servedB   string // the node id that served, when the gateway said so
	moved     bool   // the accounting moved to servedB (Pick.Reroute)
	servedEst int    // servedB's estimated matched tokens at the decision, -1 when unknown
	ended     bool
}

// errServedElsewhere ends a pick whose request the gateway sent to another node (a fallback).
var errServedElsewhere = errors.New("requests: the gateway served the request on another node")

// PickForGateway decides where a gateway should send r. It returns ErrOverloaded when every
// candidate is at its load bound, an error wrapping ErrNoNodes when no node can serve, and flow
// control's refusals as they come (router/flow); it fails for the body's content only when the
// prompt is over the prompt token cap (MaxPromptTokens: a 413 *openai.Error, as every door
// refuses it): any other request it cannot read as an OpenAI generation request (or whose
// prompt it cannot tokenise exactly) is routed by load alone, and the engine answers it as it
// would anyway.
func (s *Service) PickForGateway(ctx context.Context, r *GatewayRequest) (*GatewayPick, error) {
	start := time.Now()
	preq := PickRequest{Alternates: r.Alternates, Allowed: r.Allowed, Disaggregable: true}
	prompt, stream := -1, false
	// release is flow control's, once admitted (AdmitFlow): handed to the pick's Done, or
	// given back here when no pick is made.
	var release func()
	admitted := false
	defer func() {
		if release != nil {
			release()
		}
	}()
	path, _, _ := strings.Cut(r.Path, "?")
	chat := path == "/v1/chat/completions"
	if len(r.Body) > 0 && (chat || path == "/v1/completions") {
		h := r.Header
		if h == nil {
			h = http.Header{}
		}
		g, err := ParseGen(r.Body, chat, h)
		if IsTooLong(err) {
			return nil, err
		}
		if err == nil {
			if g.Tokens != nil {
				// Read only until Pick returns (it does not keep them).
				defer openai.ReleaseIDs(g.Tokens)
			}
			stream = g.Stream
			preq.SessionKey = g.Session
			base, adapter, err := s.ResolveModel(g)
			if err == nil {
				preq.Model, preq.AdapterID = base, adapter
				if s.flow != nil {
					// Every door's point: the model known, before tokenising.
					admitted = true
					if release, err = s.AdmitFlow(ctx, base, h); err != nil {
						return nil, err
					}
				}
				if g.Batch == nil {
					// A batch goes to one node as it is (the gateway cannot split it):
					// by load, within its model.
					toks, terr := s.PromptTokens(ctx, g, base)
					if IsTooLong(terr) {
						return nil, terr
					}
					if terr == nil && toks != nil {
						preq.Tokens, prompt = toks, len(toks)
					}
				}
			}
		}
	}
	if s.flow != nil && !admitted {
		// Not read as a generation request of a known model: admitted over every node.
		h := r.Header
		if h == nil {
			h = http.Header{}
		}
		var err error
		if release, err = s.AdmitFlow(ctx, preq.Model, h); err != nil {
			return nil, err
		}
	}
	pk, err := s.Pick(ctx, &preq, nil, 0)
	if err != nil {
		return nil, err
	}
	if leg := pk.Prefill; leg != nil {
		// The gateway's P/D sidecar on the decode node runs the prefill leg (the picker names
		// it, HeaderPrefiller): the leg ends with the request, and teaches no TTFT, since the
		// router sees only the decode node's first token.
		// It is over by the decode node's first token, or when the request ends without one.
		var once sync.Once
		end := func(o Outcome) { once.Do(func() { leg.Done(o) }) }
		done, first := pk.Done, pk.FirstToken
		pk.Done = func(o Outcome) { done(o); end(o) }
		pk.FirstToken = func() {
			end(Outcome{Status: http.StatusOK, CachedTokens: -1})
			if first != nil {
				first()
			}
		}
	}
	if release != nil {
		// Given back when the pick ends, after its in-flight count (Done is called once).
		done, rel := pk.Done, release
		pk.Done = func(o Outcome) { done(o); rel() }
		release = nil
	}
	return &GatewayPick{Pick: pk, PromptTokens: prompt, Stream: stream, s: s, start: start}, nil
}

// ResponseHeaders records the engine's response status and headers as the gateway relays them
// (servedBy is the node id the gateway says served the request, "" when it did not say).
func (g *GatewayPick) ResponseHeaders(status int, h http.Header, servedBy string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ended || g.obs != nil {
		return
	}
	g.status, g.headAt, g.servedB = status, time.Since(g.start), servedBy
	cached := -1
	if c, err := strconv.Atoi(h.Get(HeaderCachedTokens)); err == nil {
		cached = c
	}
	first := g.FirstToken
	if servedBy != "" && servedBy != g.NodeID {
		g.fellBack(servedBy)
		if !g.moved {
			first = nil // the prefix went to a node the picker cannot count it on: dropped at End
		}
	}
	g.obs = NewObserver(strings.HasPrefix(h.Get("Content-Type"), "text/event-stream"), g.start, cached, first)
}

// fellBack moves the request to the node that served it instead of the chosen one. A gateway
// moves down the list when the node failed it (connect failure, reset, 5xx: the retry conditions
// of GIE's reference config), which is what the front door's proxy counts against a node before
// retrying elsewhere.
func (g *GatewayPick) fellBack(servedBy string) {
	g.servedEst = -1
	if g.Reroute != nil {
		g.servedEst, g.moved = g.Reroute(servedBy)
	}
	g.s.health.ReportFailure(g.NodeID)
}

// ResponseBody shows a piece of the response body, as relayed, to the observer that reads the
// first token and cached_tokens; it never changes a byte.
func (g *GatewayPick) ResponseBody(p []byte) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ended || g.obs == nil {
		return
	}
	g.obs.Write(p)
}

// End ends the request, once (later calls return the zero Outcome): err is nil when the
// response ended as the gateway relayed it, else why the stream stopped (the client went away,
// the gateway reset the stream, a deadline). It returns the outcome as recorded.
func (g *GatewayPick) End(err error) Outcome {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ended {
		return Outcome{}
	}
	g.ended = true
	o := Outcome{Status: g.status, Err: err, CachedTokens: -1, Latency: time.Since(g.start)}
	if g.obs != nil {
		g.obs.Finish()
		o.CachedTokens, o.TTFT = g.obs.Cached(), g.obs.TTFT()
		if !g.obs.stream {
			o.TTFT = g.headAt
		}
	}
	if g.servedB != "" && g.servedB != g.NodeID {
		if g.moved {
			g.Done(o) // the served node's count, since the fallback
		} else {
			// The picker could not move the request: the chosen node's pick never ran there.
			g.Done(Outcome{Status: 0, Err: errServedElsewhere, CachedTokens: -1, Latency: o.Latency})
		}
		g.report(g.servedB, o.Status)
		return o
	}
	if err == nil && o.Status == 0 {
		o.Err = errNoResponse
	}
	g.Done(o)
	if g.status != 0 {
		g.report(g.NodeID, o.Status)
	}
	return o
}

// errNoResponse ends a pick whose stream closed before any response came back.
var errNoResponse = errors.New("requests: the gateway saw no response")

// report feeds passive health as the front door's proxy does: a 5xx counts against the node, a
// 429 (a busy node) against nothing.
func (g *GatewayPick) report(node string, status int) {
	switch {
	case status >= 500:
		g.s.health.ReportFailure(node)
	case status > 0 && status != http.StatusTooManyRequests:
		g.s.health.ReportSuccess(node)
	}
}

// Estimate is the estimated matched tokens of the node that served, to compare with the
// engine's cached_tokens: EstimatedMatchedTokens, or after a fallback the served node's estimate
// at the decision (an alternate's; the estimate taken then, beside the chosen node's, rather than
// one taken when the response came, which could already count this very prompt in the served
// node's summary); ok is false when none is known (the request was routed by load, or the node
// that served was not an alternate).
func (g *GatewayPick) Estimate() (tokens int, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case g.PromptTokens < 0:
		return 0, false
	case g.servedB != "" && g.servedB != g.NodeID:
		return g.servedEst, g.servedEst >= 0
	}
	return g.EstimatedMatchedTokens, true
}

// ServedElsewhere reports whether the gateway said another node served the request.
func (g *GatewayPick) ServedElsewhere() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.servedB != "" && g.servedB != g.NodeID
}
