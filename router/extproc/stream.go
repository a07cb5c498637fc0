package extproc

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	procv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"go.opentelemetry.io/otel/trace"

	"github.com/prefixmesh/prefixmesh/internal/openai"
	"github.com/prefixmesh/prefixmesh/router/flow"
	"github.com/prefixmesh/prefixmesh/router/requests"
	"github.com/prefixmesh/prefixmesh/routing"
)

// flowHeaderNames are the request headers flow control reads (lower case, as Envoy sends them).
var flowHeaderNames = func() []string {
	out := []string{strings.ToLower(flow.HeaderPriority)}
	for _, k := range flow.TenantHeaders {
		out = append(out, strings.ToLower(k))
	}
	return out
}()

// Body modes, as Envoy's ext_proc filter sends them (envoy/extensions/filters/http/ext_proc/v3
// processing_mode.proto, and GIE's pkg/epp/handlers/server.go):
//
//	FULL_DUPLEX_STREAMED  headers, then body chunks: the headers response is held until the
//	                      body ends, then the headers response (destination, Content-Length)
//	                      and the body, unchanged, in chunks of at most 62,000 bytes
//	BUFFERED              the headers are answered at once (Envoy sends the body only then);
//	                      the one body message is answered with the destination as a header
//	                      mutation and the body left as it is
//	STREAMED, NONE        the body is not seen before the headers must be answered: routed by
//	                      load at the headers, each chunk answered unchanged
//
// A request without a body, or whose body is not an OpenAI generation request, is routed by load
// alone and never refused for it. A subset hint (filter metadata envoy.lb.subset_hint, key
// x-gateway-destination-endpoint-subset) limits the choice to the listed endpoints; none eligible
// is an ImmediateResponse 503, and every candidate over its load bound a 429 with Retry-After.

// stream is one ext_proc stream's state: one HTTP request, then its response. mu guards every
// field below s, ctx and send (the reader and the deadline watcher of Process share them).
type stream struct {
	mu      sync.Mutex
	stopped bool // the stream is over: nothing more is handled or sent

	s    *Server
	ctx  context.Context
	send func(*extprocv3.ProcessingResponse) error

	reqMode, respMode procv3.ProcessingMode_BodySendMode
	overCap           bool // one stream more than MaxStreams: refused at its first message
	first             bool // the first message was seen

	path       string
	header     http.Header // the request headers the picker reads
	subset     []string
	haveSubset bool

	// chunks are the request body's chunks so far, each the bytes its message brought (nothing
	// else holds them), counted in s.buffered (the shared body budget) as held; chunkArr is their first backing array.
	chunks   [][]byte
	chunkArr [4][]byte
	held     int64
	joined   []byte // the chunks joined for the pick, pooled (body.go); nil for a body of one chunk

	// span is the request's span (nil when tracing is off or not yet started) and spanCtx the
	// context carrying it, which the decision runs under (trace.go).
	span    trace.Span
	spanCtx context.Context

	pick        *requests.GatewayPick
	dest        string // the destination list answered
	primary     string // its first endpoint
	pickedAt    time.Time
	requestDone bool // the request phase is answered (routed or refused)
	respHeaders bool // the response headers were seen
	ended       bool // the pick was ended
}

// handle processes one message; done says the stream has nothing more to do (an immediate
// response was sent). An error is a failed send: the stream is broken.
func (st *stream) handle(req *extprocv3.ProcessingRequest) (done bool, err error) {
	if !st.first {
		st.first = true
		if pc := req.GetProtocolConfig(); pc != nil {
			st.reqMode, st.respMode = pc.GetRequestBodyMode(), pc.GetResponseBodyMode()
		}
		if st.overCap {
			st.s.met.streamErrors.WithLabelValues("too_many_streams").Inc()
			return true, st.send(immediate(typev3.StatusCode_TooManyRequests, "router_overloaded",
				fmt.Sprintf("the endpoint picker has %d streams open, its limit; retry later", st.s.cfg.MaxStreams)))
		}
	}
	if req.GetObservabilityMode() {
		// Nothing may be answered: a gateway in observability mode ignores every response and
		// cannot route on one. Read nothing, change nothing.
		return false, nil
	}
	switch v := req.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return st.requestHeaders(req, v.RequestHeaders)
	case *extprocv3.ProcessingRequest_RequestBody:
		return st.requestBody(v.RequestBody)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		if !st.requestDone && st.reqMode == procv3.ProcessingMode_FULL_DUPLEX_STREAMED {
			// The body ended with trailers rather than end_of_stream.
			if done, err := st.route(true, false); done || err != nil {
				return done, err
			}
		}
		return false, st.send(trailersResponse(true))
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return false, st.responseHeaders(req, v.ResponseHeaders)
	case *extprocv3.ProcessingRequest_ResponseBody:
		return false, st.responseBody(v.ResponseBody)
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		st.end(nil)
		return false, st.send(trailersResponse(false))
	}
	return false, nil // flow-control messages and future kinds need no answer
}

func (st *stream) requestHeaders(req *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) (bool, error) {
	if st.requestDone || st.path != "" {
		st.s.met.streamErrors.WithLabelValues("protocol").Inc()
		return true, st.send(immediate(typev3.StatusCode_BadRequest, "protocol", "request headers arrived twice on one stream"))
	}
	hm := h.GetHeaders()
	st.path = headerValue(hm, ":path")
	if st.path == "" {
		st.path = "/"
	}
	st.header = http.Header{}
	if v := headerValue(hm, requests.HeaderSessionID); v != "" {
		st.header.Set(requests.HeaderSessionID, v)
	}
	if st.s.flowHeaders {
		// Flow control's class and tenant (router/flow), read by the pick as every door reads
		// them (requests.FlowRequest): only when flow control is on, so the picker's own path
		// copies nothing more.
		for _, k := range flowHeaderNames {
			if v := headerValue(hm, k); v != "" {
				st.header.Set(k, v)
			}
		}
	}
	st.subset, st.haveSubset = subsetHint(req.GetMetadataContext())
	if st.s.tracing {
		st.startSpan(hm)
	}
	switch {
	case h.GetEndOfStream():
		// No body: routed by load (GIE routes these to any ready endpoint).
		return st.route(false, false)
	case st.reqMode == procv3.ProcessingMode_FULL_DUPLEX_STREAMED:
		return false, nil // held until the body ends
	case st.reqMode == procv3.ProcessingMode_BUFFERED || st.reqMode == procv3.ProcessingMode_BUFFERED_PARTIAL:
		// Envoy sends a buffered body only once the headers are answered.
		return false, st.send(headersResponse(true, "", -1))
	default:
		// STREAMED, NONE: the headers go upstream before the body is seen.
		return st.route(false, false)
	}
}

func (st *stream) requestBody(b *extprocv3.HttpBody) (bool, error) {
	if st.requestDone {
		// STREAMED after a pick at the headers: every chunk is answered, unchanged.
		return false, st.send(plainBodyResponse(true))
	}
	chunk := b.GetBody()
	if st.held+int64(len(chunk)) > int64(st.s.cfg.MaxBodyBytes) {
		st.s.met.streamErrors.WithLabelValues("too_large").Inc()
		st.spanError("request_too_large")
		st.requestDone = true
		return true, st.send(immediate(typev3.StatusCode_PayloadTooLarge, "request_too_large",
			fmt.Sprintf("request body exceeds %d bytes", st.s.cfg.MaxBodyBytes)))
	}
	if n := int64(len(chunk)); n > 0 {
		if !st.s.buffered.Take(n) {
			st.s.met.streamErrors.WithLabelValues("busy").Inc()
			st.spanError("router_overloaded")
			st.requestDone = true
			return true, st.send(immediate(typev3.StatusCode_TooManyRequests, "router_overloaded",
				"the endpoint picker holds as many request bodies as it may; retry later"))
		}
		st.held += n
		st.s.met.buffered.Add(float64(n))
		if st.chunks == nil {
			st.chunks = st.chunkArr[:0]
		}
		st.chunks = append(st.chunks, chunk) // kept as it came: joined once, at the end
	}
	switch st.reqMode {
	case procv3.ProcessingMode_FULL_DUPLEX_STREAMED:
		if !b.GetEndOfStream() {
			return false, nil
		}
		return st.route(true, true)
	default: // BUFFERED, BUFFERED_PARTIAL: the one body message (partial: what fit)
		return st.route(true, true)
	}
}

// route picks for the request as received and answers it: for a body seen in
// FULL_DUPLEX_STREAMED, the held headers response and then the body; in BUFFERED, the body
// response; without a body, the headers response. eos says the body ended (not trailers).
func (st *stream) route(withBody, eos bool) (bool, error) {
	st.requestDone = true
	defer st.release()
	var body []byte
	if withBody {
		body = st.joinedBody()
	}
	start := time.Now()
	allowed, ok := st.allowedSet()
	if !ok {
		st.spanError("subset_empty")
		st.s.met.decisions.WithLabelValues("subset_empty").Inc()
		return true, st.send(immediate(typev3.StatusCode_ServiceUnavailable, "no_nodes_available",
			"no endpoint of the gateway's subset hint can serve this request"))
	}
	ctx := st.ctx
	if st.span != nil {
		ctx = st.spanCtx
	}
	pk, err := st.s.picker.PickForGateway(ctx, &requests.GatewayRequest{Path: st.path, Header: st.header, Body: body,
		Allowed: allowed, Alternates: st.s.cfg.Fallbacks})
	if err != nil {
		st.spanError(err.Error())
		var oe *openai.Error
		if errors.As(err, &oe) {
			// Refused for its content (a prompt over the prompt token cap, 413): answered as
			// the front door answers it, and counted with the bodies over the byte cap.
			st.s.met.streamErrors.WithLabelValues("too_large").Inc()
			return true, st.send(immediate(typev3.StatusCode(oe.Status), oe.Code, oe.Message))
		}
		var se *flow.ShedError
		if errors.As(err, &se) {
			// Shed by flow control: the front door's 429, its Retry-After and the reason.
			st.s.met.decisions.WithLabelValues("shed").Inc()
			resp := immediate(typev3.StatusCode_TooManyRequests, "router_overloaded", se.Error())
			im := resp.GetImmediateResponse()
			im.Headers.SetHeaders = append(im.Headers.SetHeaders, setHeader(strings.ToLower(flow.HeaderDroppedReason), string(se.Reason)))
			return true, st.send(resp)
		}
		if errors.Is(err, flow.ErrNoNodes) {
			st.s.met.decisions.WithLabelValues("no_nodes").Inc()
			return true, st.send(immediate(typev3.StatusCode_ServiceUnavailable, "no_nodes_available",
				"no node can serve this request: none serves its model"))
		}
		if st.ctx.Err() != nil {
			// The gateway went away while the request waited in flow control's queue.
			return true, nil
		}
		if errors.Is(err, requests.ErrOverloaded) {
			st.s.met.decisions.WithLabelValues("overloaded").Inc()
			return true, st.send(immediate(typev3.StatusCode_TooManyRequests, "router_overloaded",
				"every node that can serve this request is at its load bound; retry later"))
		}
		st.s.met.decisions.WithLabelValues("no_nodes").Inc()
		return true, st.send(immediate(typev3.StatusCode_ServiceUnavailable, "no_nodes_available", "no node can serve this request: "+err.Error()))
	}
	st.primary = endpointOf(pk.EngineURL)
	if st.primary == "" {
		st.spanError("no engine address")
		pk.Done(requests.Outcome{CachedTokens: -1})
		st.s.met.decisions.WithLabelValues("no_nodes").Inc()
		return true, st.send(immediate(typev3.StatusCode_ServiceUnavailable, "no_nodes_available",
			fmt.Sprintf("node %s announces an engine URL without an address: %q", pk.NodeID, pk.EngineURL)))
	}
	st.pick, st.pickedAt = pk, time.Now()
	st.dest = st.primary
	for _, u := range pk.Alternates {
		if e := endpointOf(u); e != "" && !strings.Contains(","+st.dest+",", ","+e+",") {
			st.dest += "," + e
		}
	}
	result := "prefix"
	if pk.PromptTokens < 0 {
		result = "load"
	}
	st.s.met.decisions.WithLabelValues(result).Inc()
	st.s.met.decideSecs.Observe(time.Since(start).Seconds())
	// The engine's request carries the picker's span as its parent (nil when not tracing).
	tp := st.traceHeaders()
	// The KV hints for llm-d's sidecar: the one this pick names is set, the others a client
	// may have sent are removed (the sidecar would act on them).
	var strip []string
	switch {
	case pk.Prefill != nil && endpointOf(pk.Prefill.EngineURL) != "":
		tp = append(tp, setHeader(HeaderPrefiller, endpointOf(pk.Prefill.EngineURL)))
		strip = []string{HeaderKVSource}
	case pk.PeerSource != nil:
		tp = append(tp, setHeader(HeaderKVSource, pk.PeerSource.Addr))
		strip = []string{HeaderPrefiller}
	default:
		strip = []string{HeaderPrefiller, HeaderKVSource}
	}
	switch {
	case !withBody:
		err = st.send(removeHeaders(headersResponse(true, st.dest, -1, tp...), strip))
	case st.reqMode == procv3.ProcessingMode_FULL_DUPLEX_STREAMED:
		if err = st.send(removeHeaders(headersResponse(true, st.dest, len(body), tp...), strip)); err == nil {
			err = streamedBodyResponses(true, body, eos, st.send)
		}
	default:
		err = st.send(removeHeaders(bufferedBodyResponse(st.dest, tp...), strip))
	}
	answered := time.Since(start)
	st.s.met.answerSecs.Observe(answered.Seconds())
	if st.s.observeAnswer != nil {
		st.s.observeAnswer(answered)
	}
	return false, err
}

// allowedSet turns the subset hint into the set of node ids the picker may choose (nil: no
// hint, every node); ok is false when the hint names no node the router knows. The hint's
// endpoints go in a set first, so the pass over the nodes tests each in O(1): the whole is
// linear in the nodes and the hint, where a scan of the hint per node (and an exclusion list
// scanned per node after) was quadratic.
func (st *stream) allowedSet() (allowed *routing.NodeSet, ok bool) {
	if !st.haveSubset {
		return nil, true
	}
	hint := make(map[string]struct{}, len(st.subset))
	for _, e := range st.subset {
		hint[e] = struct{}{}
	}
	allowed = routing.NewNodeSet()
	for _, n := range st.s.nodes.Nodes() {
		if _, in := hint[endpointOf(n.EngineURL)]; in {
			allowed.Add(n.Info.ID)
		}
	}
	return allowed, allowed.Len() > 0
}

// joinedBody is the request body in one piece: its one chunk as it came (a BUFFERED body, or a
// short one), or the chunks copied once into a pooled buffer of the body's size.
func (st *stream) joinedBody() []byte {
	switch len(st.chunks) {
	case 0:
		return nil
	case 1:
		return st.chunks[0]
	}
	b := getBody(int(st.held), st.s.cfg.MaxBodyBytes)
	for _, c := range st.chunks {
		b = append(b, c...)
	}
	st.joined = b
	return b
}

// release gives back the request body's bytes: once routed, the body went back to the gateway.
func (st *stream) release() {
	if st.held > 0 {
		st.s.buffered.Give(st.held)
		st.s.met.buffered.Sub(float64(st.held))
		st.held = 0
	}
	clear(st.chunks)
	st.chunks = nil
	putBody(st.joined)
	st.joined = nil
}

func (st *stream) responseHeaders(req *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) error {
	st.respHeaders = true
	if st.pick != nil && !st.ended {
		hm := h.GetHeaders()
		code, _ := strconv.Atoi(headerValue(hm, ":status"))
		rh := http.Header{}
		rh.Set("Content-Type", headerValue(hm, "content-type"))
		if v := headerValue(hm, requests.HeaderCachedTokens); v != "" {
			rh.Set(requests.HeaderCachedTokens, v)
		}
		served := st.servedNode(metadataString(req.GetMetadataContext(), MetadataNamespace, KeyServed))
		st.served(served)
		st.pick.ResponseHeaders(code, rh, served)
	}
	if err := st.send(headersResponse(false, "", -1)); err != nil {
		return err
	}
	if h.GetEndOfStream() {
		st.end(nil)
	}
	return nil
}

// servedNode maps the served endpoint the gateway reports to a node id: "" when it did not
// report one, the pick's own node for its endpoint, the id of the node another endpoint
// belongs to, or the endpoint itself when no known node has it (still "elsewhere").
func (st *stream) servedNode(served string) string {
	served = strings.TrimSpace(served)
	if served == "" {
		return ""
	}
	if served == st.primary {
		return st.pick.NodeID
	}
	for _, n := range st.s.nodes.Nodes() {
		if endpointOf(n.EngineURL) == served {
			return n.Info.ID
		}
	}
	return served
}

func (st *stream) responseBody(b *extprocv3.HttpBody) error {
	if st.pick != nil && !st.ended {
		st.pick.ResponseBody(b.GetBody())
	}
	var err error
	if st.respMode == procv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		err = streamedBodyResponses(false, b.GetBody(), b.GetEndOfStream(), st.send)
	} else {
		err = st.send(plainBodyResponse(false))
	}
	if b.GetEndOfStream() {
		st.end(nil)
	}
	return err
}

// end ends the pick once and records its outcome.
func (st *stream) end(err error) {
	if st.pick == nil || st.ended {
		return
	}
	st.ended = true
	pk := st.pick
	o := pk.End(err)
	met := st.s.met
	class := "none"
	switch {
	case pk.ServedElsewhere():
		class = "served_elsewhere"
	case o.Status >= 500:
		class = "5xx"
	case o.Status >= 400:
		class = "4xx"
	case o.Status > 0:
		class = "2xx"
	}
	met.outcomes.WithLabelValues(class).Inc()
	// The estimate of the node that served: after a fallback, the served node's at the decision
	// when it was an alternate; none for a request routed by load.
	estimate, known := pk.Estimate()
	if o.Status >= 200 && o.Status < 300 { // 2xx, on the node that served
		if o.TTFT > 0 {
			met.ttft.Observe(o.TTFT.Seconds())
			if !pk.ServedElsewhere() { // the prediction was the chosen node's
				met.accuracy.ObservePredictedTTFT(pk.ExpectedTTFT)
			}
		}
		if known {
			met.accuracy.Observe(estimate, o.CachedTokens, pk.PromptTokens)
		}
	}
	if !known {
		estimate = -1
	}
	st.endSpan(o, pk)
	st.s.log.Debug("request", "path", st.path, "node", pk.NodeID, "dest", st.dest, "policy", pk.Policy, "reason", pk.Reason,
		"prompt_tokens", pk.PromptTokens, "estimate", estimate, "cached_tokens", o.CachedTokens,
		"status", o.Status, "outcome", class, "ttft", o.TTFT, "latency", time.Since(st.pickedAt), "err", o.Err)
}

// closed handles the gateway's end of the stream: with response_body_mode NONE the response
// headers were the last message a gateway sends, and its closing the stream is the response's
// end; otherwise a close before the response ended cuts it.
func (st *stream) closed() {
	if st.respHeaders && st.respMode == procv3.ProcessingMode_NONE {
		st.end(nil)
		return
	}
	st.abort(errStreamClosed)
}

// abort ends the stream's pick (if any) with err and releases what the stream holds.
func (st *stream) abort(err error) { st.end(err) }

// close is the stream's last act: whatever is still open ends as the stream did.
func (st *stream) close() {
	st.end(errStreamClosed)
	st.release()
	st.endSpan(requests.Outcome{}, nil)
}
