package extproc

import (
	"context"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	procv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// FuzzStream drives one stream's state machine with any sequence of ext_proc messages a gateway
// could send (any order, any body bytes, any modes, subset hints, served endpoints): handling
// never panics, every answer is a well-formed message, and once the stream closes it holds
// nothing: no body bytes, no pick in flight.
func FuzzStream(f *testing.F) {
	body := []byte(`{"model":"prefixmesh-sim","prompt":"hello there","max_tokens":2}`)
	f.Add(byte(4), []byte{0, 1, 0x81, 3, 4 | 0x80}, body)
	f.Add(byte(2), []byte{0, 0x81, 3, 0x84}, body)
	f.Add(byte(0), []byte{0x80, 3, 0x83}, []byte(nil))
	f.Add(byte(4), []byte{0, 1, 1, 2, 3, 4, 5}, []byte(`{"model":`))
	f.Add(byte(1), []byte{6, 0, 1, 0x81, 0x81, 3, 4, 4, 0x84, 5}, body)
	r := newRig(f, rigOpts{noEngines: true, cfg: func(c *Config) { c.MaxBodyBytes, c.MaxBufferedBytes = 256, 1024 }})
	f.Fuzz(func(t *testing.T, mode byte, ops, data []byte) {
		if len(ops) > 64 {
			ops = ops[:64]
		}
		modes := []procv3.ProcessingMode_BodySendMode{procv3.ProcessingMode_NONE, procv3.ProcessingMode_STREAMED,
			procv3.ProcessingMode_BUFFERED, procv3.ProcessingMode_BUFFERED_PARTIAL, procv3.ProcessingMode_FULL_DUPLEX_STREAMED}
		sent := 0
		st := &stream{s: r.epp, ctx: context.Background(), reqMode: r.epp.cfg.DefaultRequestBodyMode, respMode: r.epp.cfg.DefaultResponseBodyMode,
			send: func(m *extprocv3.ProcessingResponse) error {
				if m.GetResponse() == nil {
					t.Fatalf("an answer without a response: %v", m)
				}
				sent++
				return nil
			}}
		off := 0
		next := func(n int) []byte {
			n = min(n, len(data)-off)
			b := data[off : off+n]
			off += n
			return b
		}
		for i, op := range ops {
			req := &extprocv3.ProcessingRequest{}
			if i == 0 {
				req.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: modes[int(mode)%len(modes)], ResponseBodyMode: modes[int(mode>>4)%len(modes)]}
			}
			eos := op&0x80 != 0
			switch op & 0x7f % 7 {
			case 0:
				req.Request = &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{EndOfStream: eos, Headers: &corev3.HeaderMap{
					Headers: []*corev3.HeaderValue{{Key: ":path", RawValue: []byte("/v1/completions")}, {Key: "content-length", RawValue: next(3)}}}}}
				if op&0x40 != 0 {
					req.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{SubsetNamespace: {Fields: map[string]*structpb.Value{
						KeySubset: structpb.NewStringValue(string(next(24)))}}}}
				}
			case 1:
				req.Request = &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: next(int(op&0x3f) * 8), EndOfStream: eos}}
			case 2:
				req.Request = &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}
			case 3:
				req.Request = &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{EndOfStream: eos, Headers: &corev3.HeaderMap{
					Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: next(3)}, {Key: "content-type", RawValue: next(17)}}}}}
				req.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{MetadataNamespace: {Fields: map[string]*structpb.Value{
					KeyServed: structpb.NewStringValue(string(next(20)))}}}}
			case 4:
				req.Request = &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: next(int(op&0x3f) * 16), EndOfStream: eos}}
			case 5:
				req.Request = &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{}}
			default:
				req.ObservabilityMode = eos
			}
			done, err := st.handle(req)
			if err != nil {
				t.Fatalf("handle: %v", err)
			}
			if done {
				break
			}
		}
		st.close()
		if n, b := r.inFlight(), r.epp.BufferedBytes(); n != 0 || b != 0 {
			t.Fatalf("after the stream: %d in flight, %d body bytes held", n, b)
		}
	})
}
