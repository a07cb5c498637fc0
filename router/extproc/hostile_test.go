package extproc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	procv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/prefixmesh/prefixmesh/router/extproc/fakegw"
)

// rawStream opens a stream and sends request headers as Envoy does in FULL_DUPLEX_STREAMED
// (protocol_config on the first message); eos says the request has no body.
func rawStream(t *testing.T, ctx context.Context, r *rig, path string, eos bool) extprocv3.ExternalProcessor_ProcessClient {
	t.Helper()
	st, err := r.client().Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	err = st.Send(&extprocv3.ProcessingRequest{
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: procv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseBodyMode: procv3.ProcessingMode_FULL_DUPLEX_STREAMED},
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{EndOfStream: eos, Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte(path)}, {Key: "content-type", RawValue: []byte("application/json")},
		}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func sendBody(st extprocv3.ExternalProcessor_ProcessClient, b []byte, eos bool) error {
	return st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos}}})
}

// immediateStatus receives until an ImmediateResponse and returns its status.
func immediateStatus(t *testing.T, st extprocv3.ExternalProcessor_ProcessClient) typev3.StatusCode {
	t.Helper()
	for {
		m, err := st.Recv()
		if err != nil {
			t.Fatalf("no immediate response: %v", err)
		}
		if ir := m.GetImmediateResponse(); ir != nil {
			return ir.GetStatus().GetCode()
		}
	}
}

// TestBodyOverLimit answers 413 to a body over MaxBodyBytes, whether it comes in one message or
// as endless chunks that never end the stream, and holds nothing afterwards.
func TestBodyOverLimit(t *testing.T) {
	r := newRig(t, rigOpts{noEngines: true, cfg: func(c *Config) { c.MaxBodyBytes = 64 << 10 }})
	st := rawStream(t, t.Context(), r, "/v1/completions", false)
	if err := sendBody(st, make([]byte, 65<<10), true); err != nil {
		t.Fatal(err)
	}
	if got := immediateStatus(t, st); got != typev3.StatusCode_PayloadTooLarge {
		t.Fatalf("one large body: %v, want 413", got)
	}

	st = rawStream(t, t.Context(), r, "/v1/completions", false)
	chunk := []byte(strings.Repeat("x", 1000))
	sent := 0
	for {
		if err := sendBody(st, chunk, false); err != nil {
			break // the picker answered and closed: the answer is in Recv
		}
		if sent += len(chunk); sent > 1<<20 {
			break // 16 × the limit: the answer must be waiting
		}
	}
	if got := immediateStatus(t, st); got != typev3.StatusCode_PayloadTooLarge {
		t.Fatalf("endless chunks: %v, want 413", got)
	}
	eventually(t, "nothing held", func() error {
		if n, b := r.epp.Streams(), r.epp.BufferedBytes(); n != 0 || b != 0 {
			return fmt.Errorf("%d streams, %d bytes held", n, b)
		}
		return nil
	})
	if got := testutil.ToFloat64(r.epp.met.streamErrors.WithLabelValues("too_large")); got != 2 {
		t.Fatalf("too_large counted %v times, want 2", got)
	}
}

// TestRequestNeverEnds answers 408 to a stream whose body never ends, once RequestTimeout has
// passed, and ends a stream that outlives MaxStreamDuration.
func TestRequestNeverEnds(t *testing.T) {
	r := newRig(t, rigOpts{noEngines: true, cfg: func(c *Config) { c.RequestTimeout, c.MaxStreamDuration = 200*time.Millisecond, 400*time.Millisecond }})
	st := rawStream(t, t.Context(), r, "/v1/completions", false)
	if err := sendBody(st, []byte(`{"model":`), false); err != nil {
		t.Fatal(err)
	}
	if got := immediateStatus(t, st); got != typev3.StatusCode_RequestTimeout {
		t.Fatalf("stalled body: %v, want 408", got)
	}

	// Routed (no body), then the response never comes: the stream's life limit ends it and the
	// pick is given back.
	st = rawStream(t, t.Context(), r, "/v1/completions", true)
	if m, err := st.Recv(); err != nil || m.GetRequestHeaders() == nil {
		t.Fatalf("headers-only request: %v %v", m, err)
	}
	if r.inFlight() != 1 {
		t.Fatalf("%d in flight after the pick, want 1", r.inFlight())
	}
	_, err := st.Recv()
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a stream over its life limit ended with %v, want DeadlineExceeded", err)
	}
	eventually(t, "the pick given back", func() error {
		if n := r.inFlight(); n != 0 {
			return fmt.Errorf("%d in flight", n)
		}
		return nil
	})
}

// TestClientCancelMidBody cancels a stream in the middle of its body, and another after its
// pick before the response: each gives back what it held.
func TestClientCancelMidBody(t *testing.T) {
	r := newRig(t, rigOpts{noEngines: true})
	ctx, cancel := context.WithCancel(t.Context())
	st := rawStream(t, ctx, r, "/v1/completions", false)
	if err := sendBody(st, []byte(`{"model":"prefixmesh-sim","prompt":"half a bo`), false); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the body held", func() error {
		if b := r.epp.BufferedBytes(); b == 0 {
			return errors.New("nothing held yet")
		}
		return nil
	})
	cancel()
	eventually(t, "the cancelled stream's body released", func() error {
		if n, b := r.epp.Streams(), r.epp.BufferedBytes(); n != 0 || b != 0 {
			return fmt.Errorf("%d streams, %d bytes held", n, b)
		}
		return nil
	})

	ctx, cancel = context.WithCancel(t.Context())
	st = rawStream(t, ctx, r, "/v1/completions", false)
	if err := sendBody(st, []byte(`{"model":"prefixmesh-sim","prompt":"a whole body"}`), true); err != nil {
		t.Fatal(err)
	}
	if m, err := st.Recv(); err != nil || m.GetRequestHeaders() == nil {
		t.Fatalf("held headers response: %v %v", m, err)
	}
	if r.inFlight() != 1 {
		t.Fatalf("%d in flight after the pick, want 1", r.inFlight())
	}
	cancel()
	eventually(t, "the cancelled pick given back", func() error {
		if n := r.inFlight(); n != 0 {
			return fmt.Errorf("%d in flight", n)
		}
		return nil
	})
}

// TestPickerRestartMidStream stops the picker's server while a routed request waits for its
// response: the gateway's stream fails (Envoy then fails the request, or passes it on with
// failure_mode_allow), the pick is given back, and a restarted picker serves the next request.
func TestPickerRestartMidStream(t *testing.T) {
	r := newRig(t, rigOpts{})
	st := rawStream(t, t.Context(), r, "/v1/completions", false)
	if err := sendBody(st, []byte(`{"model":"prefixmesh-sim","prompt":"restart me"}`), true); err != nil {
		t.Fatal(err)
	}
	if m, err := st.Recv(); err != nil || m.GetRequestHeaders() == nil {
		t.Fatalf("held headers response: %v %v", m, err)
	}
	r.grpc.Stop()
	var err error
	for err == nil { // the body's echo may have arrived before the stop
		_, err = st.Recv()
	}
	if errors.Is(err, io.EOF) {
		t.Fatalf("the stream ended cleanly under a stopped server: %v", err)
	}
	eventually(t, "the pick given back", func() error {
		if n := r.inFlight(); n != 0 {
			return fmt.Errorf("%d in flight", n)
		}
		return nil
	})
	r.start()
	_, base := r.gateway(fakegw.Config{RequestMode: procv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseMode: procv3.ProcessingMode_FULL_DUPLEX_STREAMED})
	if code, _, out := post(t, base, "/v1/completions", `{"model":"prefixmesh-sim","prompt":"after the restart","max_tokens":2}`); code != http.StatusOK {
		t.Fatalf("after the restart: %d %s", code, out)
	}
}

// TestOverloaded answers 429 with Retry-After when every candidate is at its in-flight cap.
func TestOverloaded(t *testing.T) {
	r := newRig(t, rigOpts{nodes: 1, noEngines: true, maxPer: 1})
	st := rawStream(t, t.Context(), r, "/v1/completions", true) // holds the one slot
	if m, err := st.Recv(); err != nil || m.GetRequestHeaders() == nil {
		t.Fatalf("first pick: %v %v", m, err)
	}
	st2 := rawStream(t, t.Context(), r, "/v1/completions", true)
	m, err := st2.Recv()
	if err != nil || m.GetImmediateResponse().GetStatus().GetCode() != typev3.StatusCode_TooManyRequests {
		t.Fatalf("second pick at the cap: %v %v", m, err)
	}
	retry := false
	for _, h := range m.GetImmediateResponse().GetHeaders().GetSetHeaders() {
		retry = retry || (h.GetHeader().GetKey() == "retry-after" && len(h.GetHeader().GetRawValue()) > 0)
	}
	if !retry {
		t.Fatal("429 without Retry-After")
	}
}

// TestManyStreams holds concurrentStreams streams open mid-body (race_on_test.go,
// race_off_test.go); the bound per stream it checks is what makes the default MaxStreams
// (16,384) fit in memory: the body bytes held are exactly
// what was sent, heap per stream stays small, one stream over MaxStreams is answered 429, and
// when the gateway goes away everything is released.
func TestManyStreams(t *testing.T) {
	const chunk = 1 << 10
	r := newRig(t, rigOpts{noEngines: true, cfg: func(c *Config) { c.MaxStreams = concurrentStreams }})
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	body := []byte(`{"model":"prefixmesh-sim","prompt":"` + strings.Repeat("y", chunk-36) + `"`)
	for range concurrentStreams {
		st := rawStream(t, ctx, r, "/v1/completions", false)
		if err := sendBody(st, body, false); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "every stream open and its chunk held", func() error {
		if n, b := r.epp.Streams(), r.epp.BufferedBytes(); n != concurrentStreams || b != int64(concurrentStreams*len(body)) {
			return fmt.Errorf("%d streams, %d bytes held", n, b)
		}
		return nil
	})
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	// Both ends of every stream live in this process (client and server, gRPC's buffers and
	// goroutines): a bound on the two together bounds the server's share.
	perStream := (int64(after.HeapInuse) + int64(after.StackInuse) - int64(before.HeapInuse) - int64(before.StackInuse)) / concurrentStreams
	t.Logf("%d streams: %d bytes of heap and stack per stream, both ends", concurrentStreams, perStream)
	if perStream > 256<<10 {
		t.Fatalf("%d bytes per open stream, want under 256 KiB", perStream)
	}
	over := rawStream(t, t.Context(), r, "/v1/completions", false)
	if got := immediateStatus(t, over); got != typev3.StatusCode_TooManyRequests {
		t.Fatalf("stream %d: %v, want 429", concurrentStreams+1, got)
	}
	cancel()
	eventually(t, "everything released", func() error {
		if n, b := r.epp.Streams(), r.epp.BufferedBytes(); n != 0 || b != 0 {
			return fmt.Errorf("%d streams, %d bytes held", n, b)
		}
		return nil
	})
}

// TestBufferedBudget refuses a body that would take the bytes held across streams over
// MaxBufferedBytes with 429, and accepts it again once another stream let go.
func TestBufferedBudget(t *testing.T) {
	r := newRig(t, rigOpts{noEngines: true, cfg: func(c *Config) { c.MaxBodyBytes, c.MaxBufferedBytes = 8<<10, 12<<10 }})
	ctx, cancel := context.WithCancel(t.Context())
	a := rawStream(t, ctx, r, "/v1/completions", false)
	if err := sendBody(a, make([]byte, 8<<10), false); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the first body held", func() error {
		if b := r.epp.BufferedBytes(); b != 8<<10 {
			return fmt.Errorf("%d held", b)
		}
		return nil
	})
	b := rawStream(t, t.Context(), r, "/v1/completions", false)
	if err := sendBody(b, make([]byte, 8<<10), false); err != nil {
		t.Fatal(err)
	}
	if got := immediateStatus(t, b); got != typev3.StatusCode_TooManyRequests {
		t.Fatalf("over the shared budget: %v, want 429", got)
	}
	cancel()
	eventually(t, "the first body released", func() error {
		if b := r.epp.BufferedBytes(); b != 0 {
			return fmt.Errorf("%d held", b)
		}
		return nil
	})
	c := rawStream(t, t.Context(), r, "/v1/completions", false)
	if err := sendBody(c, make([]byte, 8<<10), true); err != nil {
		t.Fatal(err)
	}
	if m, err := c.Recv(); err != nil || m.GetRequestHeaders() == nil {
		t.Fatalf("within the budget again: %v %v", m, err)
	}
}

// TestHealth serves liveness at once, and readiness and the ext_proc service only once the
// router says the node view has synced.
func TestHealth(t *testing.T) {
	r := newRig(t, rigOpts{noEngines: true})
	hc := healthpb.NewHealthClient(r.cc)
	check := func(svc string) healthpb.HealthCheckResponse_ServingStatus {
		resp, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetStatus()
	}
	for _, ready := range []bool{false, true} {
		r.epp.SetReady(ready)
		want := healthpb.HealthCheckResponse_NOT_SERVING
		if ready {
			want = healthpb.HealthCheckResponse_SERVING
		}
		if got := check(ServiceLiveness); got != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("ready %v: liveness %v", ready, got)
		}
		for _, svc := range []string{ServiceReadiness, ServiceExtProc, ""} {
			if got := check(svc); got != want {
				t.Fatalf("ready %v: %q is %v, want %v", ready, svc, got, want)
			}
		}
	}
	if ServiceExtProc != "envoy.service.ext_proc.v3.ExternalProcessor" {
		t.Fatalf("ext_proc service name %q", ServiceExtProc)
	}
}
