package extproc

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	procv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/prefixmesh/prefixmesh/internal/tokenizer"
	"github.com/prefixmesh/prefixmesh/local"
	"github.com/prefixmesh/prefixmesh/router/requests"
	"github.com/prefixmesh/prefixmesh/routing"
)

// benchFleet is a request service and an endpoint picker over 16 nodes, each holding a different
// length of the prompt's prefix in the index (as BenchmarkPickDecision in router/requests), and
// the prompt's token ids.
type benchFleet struct {
	picker *requests.PolicyPicker
	svc    *requests.Service
	client extprocv3.ExternalProcessorClient
	epp    *Server
	// answers are the picker's own answer times (from the end of the body to the last answer
	// handed to gRPC), appended by its hook; the benchmark runs one stream at a time.
	answers []time.Duration
	toks    []uint32
	ids     []byte // an 8k-token completions body of token ids
	text    []byte // an 8k-token completions body of text (cl100k_base)
}

// benchBlockSize is the bench fleet's block size in tokens (the simulated engine's).
const benchBlockSize = 16

func newBenchFleet(b *testing.B) *benchFleet {
	const nodes, bs = 16, benchBlockSize
	tok, err := tokenizer.New(tokenizer.CL100kBase)
	if err != nil {
		b.Fatal(err)
	}
	var sb strings.Builder
	for i := 0; i < 600; i++ { // ~16 tokens a sentence: enough for 8k tokens
		fmt.Fprintf(&sb, "Request %d asks the router which node caches the longest prefix of this prompt. ", i)
	}
	toks := tok.Encode(sb.String())[:8192]
	text, _ := json.Marshal(map[string]any{"model": simModel, "prompt": tok.Decode(toks), "max_tokens": 8})
	ids, _ := json.Marshal(map[string]any{"model": simModel, "prompt": toks, "max_tokens": 8})
	// The text round-trips to the same ids, so the index holds the same chain for both bodies.
	if got := tok.Encode(tok.Decode(toks)); !slices.Equal(got, toks) {
		b.Fatalf("the text prompt tokenises to %d other ids", len(got))
	}
	hashes := local.BlockHashes(toks, bs, 0)
	list := &nodeList{}
	idx := routing.NewIndex(routing.DefaultIndexConfig())
	for i := range nodes {
		id := fmt.Sprintf("node-%02d", i)
		list.nodes = append(list.nodes, requests.NodeTarget{EngineURL: fmt.Sprintf("http://10.0.0.%d:8000", i+1),
			Info: routing.NodeInfo{ID: id, Alive: true, Model: simModel, BlockSize: bs}})
		idx.ReplaceNode(id, 1, 1, hashes[:i*len(hashes)/nodes])
	}
	pol, err := routing.NewPolicy(routing.PolicyPrefixMesh, routing.DefaultPolicyConfig())
	if err != nil {
		b.Fatal(err)
	}
	f := &benchFleet{toks: toks, ids: ids, text: text}
	if f.picker, err = requests.NewPolicyPicker(list, idx, routing.NewOverlay(0, 0), pol, requests.PolicyPickerConfig{}); err != nil {
		b.Fatal(err)
	}
	scfg := requests.DefaultConfig()
	scfg.Tokenizer = tokenizer.CL100kBase
	if f.svc, err = requests.New(scfg, requests.Deps{Picker: f.picker, Nodes: list}); err != nil {
		b.Fatal(err)
	}
	epp, err := New(DefaultConfig(), Deps{Picker: f.svc, Nodes: list, Registry: prometheus.NewRegistry()})
	f.epp = epp
	epp.observeAnswer = func(d time.Duration) { f.answers = append(f.answers, d) } // one stream at a time
	if err != nil {
		b.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer(epp.GRPCOptions()...)
	epp.Register(srv)
	go func() { _ = srv.Serve(lis) }()
	b.Cleanup(srv.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cc.Close() })
	f.client = extprocv3.NewExternalProcessorClient(cc)
	return f
}

// processCPU is the CPU time the process has used so far (getrusage: user plus system).
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportLatency reports the p50 and p99 of d (µs) under name.
func reportLatency(b *testing.B, name string, d []time.Duration) float64 {
	slices.Sort(d)
	p50 := float64(d[len(d)/2].Nanoseconds()) / 1e3
	b.ReportMetric(p50, name+"p50-µs")
	b.ReportMetric(float64(d[len(d)*99/100].Nanoseconds())/1e3, name+"p99-µs")
	return p50
}

// eppRoundTrip is one request through the endpoint picker as Envoy sends it in
// FULL_DUPLEX_STREAMED: a new stream, the headers, the body in 16 KiB chunks; timed to the last
// body response (when Envoy can forward). The response side (headers only, end of stream) is
// then sent to end the pick, untimed.
func (f *benchFleet) eppRoundTrip(b *testing.B, body []byte) (full, tail time.Duration) {
	start := time.Now()
	st, err := f.client.Process(b.Context())
	if err != nil {
		b.Fatal(err)
	}
	err = st.Send(&extprocv3.ProcessingRequest{
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: procv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseBodyMode: procv3.ProcessingMode_FULL_DUPLEX_STREAMED},
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/completions")},
			{Key: "content-type", RawValue: []byte("application/json")},
		}}}},
	})
	if err != nil {
		b.Fatal(err)
	}
	var last time.Time
	for off := 0; off < len(body); off += 16 << 10 {
		end := min(off+16<<10, len(body))
		if end == len(body) {
			last = time.Now()
		}
		if err := sendBody(st, body[off:end], end == len(body)); err != nil {
			b.Fatal(err)
		}
	}
	for {
		m, err := st.Recv()
		if err != nil {
			b.Fatal(err)
		}
		if m.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetEndOfStream() {
			break
		}
	}
	now := time.Now()
	full, tail = now.Sub(start), now.Sub(last)
	if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
		EndOfStream: true, Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte("200")}}}}}}); err != nil {
		b.Fatal(err)
	}
	_ = st.CloseSend()
	for {
		if _, err := st.Recv(); err == io.EOF {
			break
		} else if err != nil {
			b.Fatal(err)
		}
	}
	return full, tail
}

// BenchmarkDecision is the decision latency of an 8k-token prompt over 16 nodes, three ways in
// the same run beside hashing its prompt, each its own loop (so that each pays for its own
// garbage), reported as p50/p99 in µs and CPU per request:
//
//	hash       hashing the prompt's ids into its block hashes (local.AppendBlockHashes), the
//	           floor the picker is measured against
//	picker     requests.PolicyPicker.Pick on the token ids (candidates, hashing, estimate,
//	           policy, in-flight and overlay bookkeeping) and Done: the decision itself
//	service    requests.Service.PickForGateway in process: the request service's parse,
//	           tokenizer and pick, what the front door also does before proxying
//	extproc    the same through ext_proc on loopback gRPC, as Envoy sends it (a stream per
//	           request, headers, the body in 16 KiB chunks, up to the last body response)
//
// extproc-tail is the part of extproc after the body's last chunk left the gateway: what a
// request waits beyond its own upload, since Envoy streams the body to the picker as the client
// sends it. cpu-µs is the process's CPU time (user and system, every goroutine: for extproc both
// ends of the stream, the gateway's and the picker's) per request, which a machine shared with
// other work disturbs less than the latencies. picker-side is the endpoint picker's own part of
// extproc: from the body's last message reaching its handler to the last answer handed to gRPC
// (parse, tokenise, pick, encode the destination and the body back), without the transport or
// the gateway's side. extproc reports added-p50-µs, added-tail-p50-µs and
// added-picker-side-p50-µs: its p50s minus picker's from the same run (when both ran). "ids" sends the
// prompt as token ids, "text" as text the tokenizer turns into the same 8,192 ids.
func BenchmarkDecision(b *testing.B) {
	f := newBenchFleet(b)
	for _, c := range []struct {
		name string
		body []byte
	}{{"ids", f.ids}, {"text", f.text}} {
		var pickerP50 float64
		req := &requests.PickRequest{Tokens: f.toks, Model: simModel}
		greq := &requests.GatewayRequest{Path: "/v1/completions", Body: c.body}
		b.Run(c.name+"/hash", func(b *testing.B) {
			dst := make([]uint64, 0, len(f.toks)/benchBlockSize)
			b.ReportAllocs()
			for b.Loop() {
				dst = local.AppendBlockHashes(dst[:0], f.toks, benchBlockSize, 0)
			}
		})
		b.Run(c.name+"/picker", func(b *testing.B) {
			var d []time.Duration
			c0 := processCPU(b)
			for b.Loop() {
				t0 := time.Now()
				pk, err := f.picker.Pick(b.Context(), req, nil)
				if err != nil {
					b.Fatal(err)
				}
				pk.Done(requests.Outcome{Status: 200})
				d = append(d, time.Since(t0))
			}
			reportCPU(b, processCPU(b)-c0, len(d))
			pickerP50 = reportLatency(b, "", d)
		})
		b.Run(c.name+"/service", func(b *testing.B) {
			var d []time.Duration
			c0 := processCPU(b)
			for b.Loop() {
				t0 := time.Now()
				gp, err := f.svc.PickForGateway(b.Context(), greq)
				if err != nil {
					b.Fatal(err)
				}
				d = append(d, time.Since(t0))
				if gp.PromptTokens != len(f.toks) {
					b.Fatalf("the service read %d tokens, want %d", gp.PromptTokens, len(f.toks))
				}
				gp.End(nil)
			}
			reportCPU(b, processCPU(b)-c0, len(d))
			reportLatency(b, "", d)
		})
		b.Run(c.name+"/extproc", func(b *testing.B) {
			var full, tail []time.Duration
			f.answers = f.answers[:0]
			c0 := processCPU(b)
			for b.Loop() {
				fd, td := f.eppRoundTrip(b, c.body)
				full, tail = append(full, fd), append(tail, td)
			}
			reportCPU(b, processCPU(b)-c0, len(full))
			e := reportLatency(b, "", full)
			et := reportLatency(b, "tail-", tail)
			ea := reportLatency(b, "picker-side-", f.answers)
			if pickerP50 > 0 {
				b.ReportMetric(e-pickerP50, "added-p50-µs")
				b.ReportMetric(et-pickerP50, "added-tail-p50-µs")
				b.ReportMetric(ea-pickerP50, "added-picker-side-p50-µs")
			}
		})
	}
}

// reportCPU reports CPU time per request.
func reportCPU(b *testing.B, cpu time.Duration, n int) {
	b.ReportMetric(float64(cpu.Microseconds())/float64(max(n, 1)), "cpu-µs")
}
