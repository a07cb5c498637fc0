// Package fakegw is a gateway that speaks ext_proc to an endpoint picker the way Envoy's ext_proc
// filter does (envoy/source/extensions/filters/http/ext_proc, and the message sequences of
// envoy/extensions/filters/http/ext_proc/v3 processing_mode.proto): for each HTTP request it
// opens one stream, sends the request headers and body in the configured mode, applies the
// picker's header mutations, forwards the request to the endpoint in
// x-gateway-destination-endpoint (trying the fallbacks after it on a connect error, as a retry
// policy would), and streams the engine's response back through the picker, reporting the
// endpoint that served in the metadata context (envoy.lb x-gateway-destination-endpoint-served).
// It is the stand-in for Envoy in tests and in `router demo --gateway`: no Envoy binary needed.
package fakegw

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	procv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// Header names the gateway adds to its responses to the client, for tests and the demo.
const (
	HeaderDestination = "X-Fakegw-Destination" // the destination list the picker answered
	HeaderServed      = "X-Fakegw-Served"      // the endpoint that served
)

// maxClientBody bounds what the gateway reads from its client: above any picker's cap, so the
// picker's own limit is what a test meets.
const maxClientBody = 64 << 20

// Config is how the gateway speaks to the picker.
type Config struct {
	// RequestMode and ResponseMode are the body send modes (FULL_DUPLEX_STREAMED or BUFFERED;
	// NONE sends no body to the picker).
	RequestMode, ResponseMode procv3.ProcessingMode_BodySendMode
	// NoProtocolConfig leaves protocol_config out of the first message (Envoy before 1.34).
	NoProtocolConfig bool
	// Chunks are the sizes request body chunks are cut to in FULL_DUPLEX_STREAMED, cycled
	// (awkward splits); empty: 16 KiB, Envoy's usual buffer slice.
	Chunks []int
	// Subset, when not nil, is sent as the subset hint.
	Subset []string
	// Client forwards to engines (nil: a client of its own).
	Client *http.Client
}

// Decision is what the gateway saw of one request, for tests.
type Decision struct {
	Status        int    // the status returned to the client
	Destination   string // the header's value
	Metadata      string // the dynamic metadata's value
	Served        string // the endpoint that served ("" if none)
	ContentLength string // the Content-Length the picker set ("" if none)
	Immediate     bool   // the picker answered with an ImmediateResponse
	BodyIntact    bool   // the body sent upstream equalled the client's
}

// Gateway is an http.Handler that routes through an ext_proc picker.
type Gateway struct {
	cfg    Config
	picker extprocv3.ExternalProcessorClient
	client *http.Client

	mu        sync.Mutex // guards decisions
	decisions []Decision
}

// New returns a gateway over picker.
func New(picker extprocv3.ExternalProcessorClient, cfg Config) *Gateway {
	c := cfg.Client
	if c == nil {
		// Compression off so bytes pass unchanged; idle connections kept per engine as a
		// gateway keeps its upstream pool (net/http's default of 2 would churn connections).
		c = &http.Client{Transport: &http.Transport{DisableCompression: true, MaxIdleConnsPerHost: 256}}
	}
	return &Gateway{cfg: cfg, picker: picker, client: c}
}

// Decisions returns what the gateway saw so far, oldest first.
func (g *Gateway) Decisions() []Decision {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]Decision(nil), g.decisions...)
}

func (g *Gateway) record(d Decision) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.decisions) >= 1<<16 {
		g.decisions = g.decisions[1:]
	}
	g.decisions = append(g.decisions, d)
}

// ServeHTTP routes one request through the picker and the engine it names.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	d, err := g.serve(w, r)
	g.record(d)
	if err != nil && d.Status == 0 {
		// Envoy's failure_mode_allow: false answers 500 when the processor fails.
		http.Error(w, "ext_proc: "+err.Error(), http.StatusInternalServerError)
	}
}

// exchange is one stream with the picker.
type exchange struct {
	st   extprocv3.ExternalProcessor_ProcessClient
	sent bool // the first message went (it carries protocol_config)
	g    *Gateway
}

func (x *exchange) send(m *extprocv3.ProcessingRequest) error {
	if err := x.sendRaw(m); errors.Is(err, io.EOF) {
		// The picker ended the stream: its last word (an ImmediateResponse) is in Recv.
		_, rerr := x.recv()
		if rerr == nil {
			rerr = err
		}
		return rerr
	} else {
		return err
	}
}

func (x *exchange) sendRaw(m *extprocv3.ProcessingRequest) error {
	if !x.sent {
		x.sent = true
		if !x.g.cfg.NoProtocolConfig {
			m.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: x.g.cfg.RequestMode, ResponseBodyMode: x.g.cfg.ResponseMode}
		}
	}
	return x.st.Send(m)
}

// errImmediate carries the picker's ImmediateResponse up to serve.
type errImmediate struct{ r *extprocv3.ImmediateResponse }

func (e errImmediate) Error() string {
	return "immediate response " + e.r.GetStatus().GetCode().String()
}

func (x *exchange) recv() (*extprocv3.ProcessingResponse, error) {
	m, err := x.st.Recv()
	if err != nil {
		return nil, err
	}
	if ir := m.GetImmediateResponse(); ir != nil {
		return nil, errImmediate{ir}
	}
	return m, nil
}

func (g *Gateway) serve(w http.ResponseWriter, r *http.Request) (Decision, error) {
	var d Decision
	body, err := io.ReadAll(io.LimitReader(r.Body, maxClientBody))
	if err != nil {
		return d, err
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	st, err := g.picker.Process(ctx)
	if err != nil {
		return d, err
	}
	x := &exchange{st: st, g: g}
	defer func() { _ = st.CloseSend() }()

	hdrs := requestHeaders(r, len(body))
	md := &corev3.Metadata{}
	if g.cfg.Subset != nil {
		vals := make([]*structpb.Value, len(g.cfg.Subset))
		for i, e := range g.cfg.Subset {
			vals[i] = structpb.NewStringValue(e)
		}
		md.FilterMetadata = map[string]*structpb.Struct{"envoy.lb.subset_hint": {Fields: map[string]*structpb.Value{
			"x-gateway-destination-endpoint-subset": structpb.NewListValue(&structpb.ListValue{Values: vals}),
		}}}
	}
	noBody := len(body) == 0 || g.cfg.RequestMode == procv3.ProcessingMode_NONE
	headerMsg := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: hdrs, EndOfStream: len(body) == 0}}, MetadataContext: md}

	var mutations []*extprocv3.HeaderMutation
	var dynMeta []*structpb.Struct
	upBody := body
	fail := func(err error) (Decision, error) {
		var im errImmediate
		if errors.As(err, &im) {
			d.Immediate = true
			d.Status = writeImmediate(w, im.r)
			return d, nil
		}
		return d, err
	}
	if err := x.send(headerMsg); err != nil {
		return fail(err)
	}
	switch {
	case noBody:
		m, err := x.recv()
		if err != nil {
			return fail(err)
		}
		mutations, dynMeta = append(mutations, m.GetRequestHeaders().GetResponse().GetHeaderMutation()), append(dynMeta, m.GetDynamicMetadata())
	case g.cfg.RequestMode == procv3.ProcessingMode_BUFFERED:
		m, err := x.recv() // the headers first: only then does Envoy send a buffered body
		if err != nil {
			return fail(err)
		}
		mutations, dynMeta = append(mutations, m.GetRequestHeaders().GetResponse().GetHeaderMutation()), append(dynMeta, m.GetDynamicMetadata())
		if err := x.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}}); err != nil {
			return fail(err)
		}
		m, err = x.recv()
		if err != nil {
			return fail(err)
		}
		cr := m.GetRequestBody().GetResponse()
		mutations, dynMeta = append(mutations, cr.GetHeaderMutation()), append(dynMeta, m.GetDynamicMetadata())
		if b := cr.GetBodyMutation().GetBody(); b != nil {
			upBody = b
		}
	default: // FULL_DUPLEX_STREAMED: the whole body goes out; the answers come after it
		chunks := g.cfg.Chunks
		if len(chunks) == 0 {
			chunks = []int{16 << 10}
		}
		for off, i := 0, 0; off < len(body); i++ {
			n := min(max(chunks[i%len(chunks)], 1), len(body)-off)
			if err := x.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{
				Body: body[off : off+n], EndOfStream: off+n == len(body)}}}); err != nil {
				return fail(err)
			}
			off += n
		}
		m, err := x.recv()
		if err != nil {
			return fail(err)
		}
		if m.GetRequestHeaders() == nil {
			return d, fmt.Errorf("picker answered %T before the request headers", m.GetResponse())
		}
		mutations, dynMeta = append(mutations, m.GetRequestHeaders().GetResponse().GetHeaderMutation()), append(dynMeta, m.GetDynamicMetadata())
		var got bytes.Buffer
		for {
			m, err := x.recv()
			if err != nil {
				return fail(err)
			}
			sr := m.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
			if sr == nil {
				return d, fmt.Errorf("picker answered %T, not a streamed request body", m.GetResponse())
			}
			if len(sr.GetBody()) > 62000 {
				return d, fmt.Errorf("picker sent a %d-byte chunk, over 62,000", len(sr.GetBody()))
			}
			got.Write(sr.GetBody())
			if sr.GetEndOfStream() {
				break
			}
		}
		upBody = got.Bytes()
	}
	d.BodyIntact = bytes.Equal(upBody, body)
	up := http.Header{}
	for _, h := range hdrs.GetHeaders() {
		if !strings.HasPrefix(h.GetKey(), ":") {
			up.Set(h.GetKey(), string(h.GetRawValue()))
		}
	}
	for _, hm := range mutations {
		for _, k := range hm.GetRemoveHeaders() {
			up.Del(k)
		}
		for _, o := range hm.GetSetHeaders() {
			v := string(o.GetHeader().GetRawValue())
			if v == "" {
				v = o.GetHeader().GetValue()
			}
			up.Set(o.GetHeader().GetKey(), v)
		}
	}
	d.Destination = up.Get("x-gateway-destination-endpoint")
	d.ContentLength = up.Get("content-length")
	for _, s := range dynMeta {
		if v := s.GetFields()["envoy.lb"].GetStructValue().GetFields()["x-gateway-destination-endpoint"].GetStringValue(); v != "" {
			d.Metadata = v
		}
	}
	if d.Destination == "" {
		return d, errors.New("the picker named no destination")
	}

	// Forward, trying the fallbacks on a connect error (a retry policy on connect-failure).
	var resp *http.Response
	var lastErr error
	for _, ep := range strings.Split(d.Destination, ",") {
		req, err := http.NewRequestWithContext(ctx, r.Method, "http://"+ep+r.URL.RequestURI(), bytes.NewReader(upBody))
		if err != nil {
			return d, err
		}
		req.Header = up.Clone()
		req.Header.Del("x-gateway-destination-endpoint")
		req.Header.Del("content-length")
		if resp, lastErr = g.client.Do(req); lastErr == nil {
			d.Served = ep
			break
		}
	}
	if resp == nil {
		return d, fmt.Errorf("no destination answered: %w", lastErr)
	}
	defer resp.Body.Close()
	return g.respond(w, x, resp, d)
}

// respond streams the engine's response through the picker to the client.
func (g *Gateway) respond(w http.ResponseWriter, x *exchange, resp *http.Response, d Decision) (Decision, error) {
	rh := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte(strconv.Itoa(resp.StatusCode))}}}
	for k, vs := range resp.Header {
		for _, v := range vs {
			rh.Headers = append(rh.Headers, &corev3.HeaderValue{Key: strings.ToLower(k), RawValue: []byte(v)})
		}
	}
	served := &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"envoy.lb": {Fields: map[string]*structpb.Value{
		"x-gateway-destination-endpoint-served": structpb.NewStringValue(d.Served)}}}}
	if err := x.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: rh}},
		MetadataContext: served}); err != nil {
		return d, err
	}
	if _, err := x.recv(); err != nil {
		return d, err
	}
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	w.Header().Set(HeaderDestination, d.Destination)
	w.Header().Set(HeaderServed, d.Served)
	w.WriteHeader(resp.StatusCode)
	d.Status = resp.StatusCode
	flush := func() { _ = http.NewResponseController(w).Flush() }
	if g.cfg.ResponseMode == procv3.ProcessingMode_NONE {
		_, err := io.Copy(w, resp.Body)
		return d, err
	}
	if g.cfg.ResponseMode == procv3.ProcessingMode_BUFFERED {
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return d, err
		}
		if err := x.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: b, EndOfStream: true}}}); err != nil {
			return d, err
		}
		m, err := x.recv()
		if err != nil {
			return d, err
		}
		if nb := m.GetResponseBody().GetResponse().GetBodyMutation().GetBody(); nb != nil {
			b = nb
		}
		_, err = w.Write(b)
		return d, err
	}
	buf := make([]byte, 32<<10)
	for {
		n, rerr := resp.Body.Read(buf)
		eos := errors.Is(rerr, io.EOF)
		if rerr != nil && !eos {
			return d, rerr
		}
		if n == 0 && !eos {
			continue
		}
		if err := x.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{
			Body: append([]byte(nil), buf[:n]...), EndOfStream: eos}}}); err != nil {
			return d, err
		}
		// The picker echoes the chunk (in pieces of at most 62,000 bytes): read until all of
		// it came back, and the end of stream with the last.
		for want := n; want > 0 || eos; {
			m, err := x.recv()
			if err != nil {
				return d, err
			}
			sr := m.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
			if sr == nil {
				return d, fmt.Errorf("picker answered %T, not a streamed response body", m.GetResponse())
			}
			if _, err := w.Write(sr.GetBody()); err != nil {
				return d, err
			}
			flush()
			want -= len(sr.GetBody())
			if sr.GetEndOfStream() {
				return d, nil
			}
		}
	}
}

// requestHeaders is the request's header map as Envoy sends it: pseudo-headers first, names in
// lower case, values in raw_value.
func requestHeaders(r *http.Request, bodyLen int) *corev3.HeaderMap {
	hm := &corev3.HeaderMap{}
	add := func(k, v string) { hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: k, RawValue: []byte(v)}) }
	add(":method", r.Method)
	add(":path", r.URL.RequestURI())
	add(":authority", r.Host)
	add(":scheme", "http")
	for k, vs := range r.Header {
		for _, v := range vs {
			add(strings.ToLower(k), v)
		}
	}
	if bodyLen > 0 && r.Header.Get("Content-Length") == "" {
		add("content-length", strconv.Itoa(bodyLen))
	}
	return hm
}

// writeImmediate writes the picker's ImmediateResponse to the client, as Envoy does.
func writeImmediate(w http.ResponseWriter, ir *extprocv3.ImmediateResponse) int {
	for _, o := range ir.GetHeaders().GetSetHeaders() {
		v := string(o.GetHeader().GetRawValue())
		if v == "" {
			v = o.GetHeader().GetValue()
		}
		w.Header().Set(o.GetHeader().GetKey(), v)
	}
	code := int(ir.GetStatus().GetCode())
	if code == 0 {
		code = http.StatusOK
	}
	w.WriteHeader(code)
	_, _ = w.Write(ir.GetBody())
	return code
}
