package extproc

import (
	"encoding/json"
	"net"
	"net/url"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/prefixmesh/prefixmesh/internal/openai"
)

// headerValue is h's value for key (lower case, as Envoy sends HTTP/2-style names): raw_value
// when set (Envoy sends it since 1.27), value otherwise; "" when absent.
func headerValue(h *corev3.HeaderMap, key string) string {
	for _, hv := range h.GetHeaders() {
		if strings.EqualFold(hv.GetKey(), key) {
			if len(hv.GetRawValue()) > 0 {
				return string(hv.GetRawValue())
			}
			return hv.GetValue()
		}
	}
	return ""
}

// setHeader is a header mutation that replaces any value of key, with raw_value set (the field
// Envoy reads first; value is left empty, as GIE's EPP does).
func setHeader(key, value string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: key, RawValue: []byte(value)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

// destinationMetadata is the dynamic metadata {envoy.lb: {x-gateway-destination-endpoint: dest}}.
func destinationMetadata(dest string) *structpb.Struct {
	return &structpb.Struct{Fields: map[string]*structpb.Value{
		MetadataNamespace: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			HeaderDestination: structpb.NewStringValue(dest),
		}}),
	}}
}

// metadataString reads md's filter metadata ns.key as a string ("" when absent or not one).
func metadataString(md *corev3.Metadata, ns, key string) string {
	s := md.GetFilterMetadata()[ns]
	if s == nil {
		return ""
	}
	return s.GetFields()[key].GetStringValue()
}

// subsetHint reads the gateway's subset hint: ok is false when the key is absent; a list value
// is the endpoints, a string value a comma-separated list (both occur in gateways' configs).
func subsetHint(md *corev3.Metadata) (endpoints []string, ok bool) {
	s := md.GetFilterMetadata()[SubsetNamespace]
	if s == nil {
		return nil, false
	}
	v, ok := s.GetFields()[KeySubset]
	if !ok {
		return nil, false
	}
	switch k := v.GetKind().(type) {
	case *structpb.Value_ListValue:
		for _, e := range k.ListValue.GetValues() {
			if e := strings.TrimSpace(e.GetStringValue()); e != "" {
				endpoints = append(endpoints, e)
			}
		}
	case *structpb.Value_StringValue:
		for _, e := range strings.Split(k.StringValue, ",") {
			if e = strings.TrimSpace(e); e != "" {
				endpoints = append(endpoints, e)
			}
		}
	}
	return endpoints, true
}

// endpointOf is an engine URL's host:port, the form the protocol names endpoints in (the
// scheme's default port when the URL has none); "" for a URL that does not parse.
func endpointOf(engineURL string) string {
	u, err := url.Parse(engineURL)
	if err != nil || u.Host == "" {
		return ""
	}
	if u.Port() != "" {
		return u.Host
	}
	port := "80"
	if u.Scheme == "https" {
		port = "443"
	}
	return net.JoinHostPort(u.Hostname(), port)
}

// headersResponse answers request or response headers; dest != "" sets the destination header,
// the dynamic metadata, extra (the trace context) and, when bodyLen >= 0, Content-Length (a body
// returned through the stream must keep its length true, as GIE's EPP does).
func headersResponse(request bool, dest string, bodyLen int, extra ...*corev3.HeaderValueOption) *extprocv3.ProcessingResponse {
	hr := &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{}}
	out := &extprocv3.ProcessingResponse{}
	if dest != "" {
		hm := &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader(HeaderDestination, dest)}}
		if bodyLen >= 0 {
			hm.SetHeaders = append(hm.SetHeaders, setHeader("content-length", strconv.Itoa(bodyLen)))
		}
		hm.SetHeaders = append(hm.SetHeaders, extra...)
		hr.Response.HeaderMutation = hm
		// The route was chosen on the request's headers before the destination existed.
		hr.Response.ClearRouteCache = true
		out.DynamicMetadata = destinationMetadata(dest)
	}
	if request {
		out.Response = &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: hr}
	} else {
		out.Response = &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: hr}
	}
	return out
}

// bufferedBodyResponse answers a BUFFERED request body: the destination (and extra, the trace
// context) as a header mutation (Envoy applies header mutations from a buffered body's response:
// the headers have not gone upstream yet) and no body mutation, so the body and its
// Content-Length stay as they are.
func bufferedBodyResponse(dest string, extra ...*corev3.HeaderValueOption) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{
			HeaderMutation:  &extprocv3.HeaderMutation{SetHeaders: append([]*corev3.HeaderValueOption{setHeader(HeaderDestination, dest)}, extra...)},
			ClearRouteCache: true,
		}}},
		DynamicMetadata: destinationMetadata(dest),
	}
}

// plainBodyResponse answers a body chunk without changing it (BUFFERED and STREAMED modes).
func plainBodyResponse(request bool) *extprocv3.ProcessingResponse {
	br := &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{}}
	if request {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: br}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: br}}
}

// streamedBodyResponses returns body, unchanged, as FULL_DUPLEX_STREAMED body responses of at
// most MaxChunkBytes each; eos marks the last (GIE's BuildChunkedBodyResponses). An empty body
// is one empty chunk.
func streamedBodyResponses(request bool, body []byte, eos bool, send func(*extprocv3.ProcessingResponse) error) error {
	for first := true; first || len(body) > 0; first = false {
		n := min(len(body), MaxChunkBytes)
		chunk := body[:n:n]
		body = body[n:]
		br := &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
			Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{
				Body: chunk, EndOfStream: eos && len(body) == 0,
			}},
		}}}
		var r *extprocv3.ProcessingResponse
		if request {
			r = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: br}}
		} else {
			r = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: br}}
		}
		if err := send(r); err != nil {
			return err
		}
	}
	return nil
}

// trailersResponse answers trailers without changing them.
func trailersResponse(request bool) *extprocv3.ProcessingResponse {
	if request {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}}
}

// retryAfterSeconds is the Retry-After of a 429 the picker answers (the front door's,
// internal/openai's default).
const retryAfterSeconds = openai.DefaultRetryAfter

// immediate is an ImmediateResponse with status and an OpenAI-shaped JSON error body; 429 and
// 503 carry Retry-After.
func immediate(status typev3.StatusCode, code, msg string) *extprocv3.ProcessingResponse {
	hm := &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader("content-type", "application/json")}}
	if status == typev3.StatusCode_TooManyRequests || status == typev3.StatusCode_ServiceUnavailable {
		hm.SetHeaders = append(hm.SetHeaders, setHeader("retry-after", retryAfterSeconds))
	}
	type errBody struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    string  `json:"code"`
	}
	body, _ := json.Marshal(struct {
		Error errBody `json:"error"`
	}{errBody{Message: msg, Type: errType(status), Code: code}})
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
		Status: &typev3.HttpStatus{Code: status}, Headers: hm, Body: body, Details: "prefixmesh_" + code,
	}}}
}

// errType is OpenAI's error type for a status.
func errType(status typev3.StatusCode) string {
	if status >= 500 {
		return "server_error"
	}
	return "invalid_request_error"
}

// removeHeaders adds names to the header mutation of resp (a request headers or body answer
// that sets the destination), for the gateway to remove from the request before it goes
// upstream; resp is returned.
func removeHeaders(resp *extprocv3.ProcessingResponse, names []string) *extprocv3.ProcessingResponse {
	var cr *extprocv3.CommonResponse
	switch r := resp.Response.(type) {
	case *extprocv3.ProcessingResponse_RequestHeaders:
		cr = r.RequestHeaders.GetResponse()
	case *extprocv3.ProcessingResponse_RequestBody:
		cr = r.RequestBody.GetResponse()
	}
	if cr == nil || len(names) == 0 {
		return resp
	}
	if cr.HeaderMutation == nil {
		cr.HeaderMutation = &extprocv3.HeaderMutation{}
	}
	cr.HeaderMutation.RemoveHeaders = append(cr.HeaderMutation.RemoveHeaders, names...)
	return resp
}
