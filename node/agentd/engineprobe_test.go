package agentd

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestParseEngineMetrics(t *testing.T) {
	text := `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:num_requests_waiting{engine="0",model_name="m"} 7.0
process_start_time_seconds 1.7e+09
sglang:num_queue_reqs 1
garbage line
prefixmesh_simengine_free_blocks 100
`
	started, ld := parseEngineMetrics(strings.NewReader(text))
	if started != 1.7e9 || ld.Running != 5 || ld.Waiting != 8 || ld.FreeBlocks != 100 {
		t.Fatalf("started %v load %+v", started, ld)
	}
}

// The probe follows the engine's health, and a changed process start time is reported as a
// restart (the event stream may say nothing when an engine restarts between steps).
func TestEngineProbeFollowsEngine(t *testing.T) {
	var start atomic.Int64
	start.Store(1000)
	var healthy atomic.Bool
	healthy.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
			if !healthy.Load() {
				w.WriteHeader(http.StatusServiceUnavailable)
			}
		case "/metrics":
			fmt.Fprintf(w, "process_start_time_seconds %d\nvllm:num_requests_running 4\n", start.Load())
		case "/v1/models":
			fmt.Fprint(w, `{"object":"list","data":[{"id":"lora-a","parent":"base-m"},{"id":"base-m","parent":null}]}`)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := slog.New(slog.DiscardHandler)
	if m, err := engineModel(ctx, srv.URL, log); err != nil || m != "base-m" {
		t.Fatalf("engine model %q, %v", m, err)
	}
	var restarts atomic.Int32
	p := newEngineProbe(srv.URL, log, func() { restarts.Add(1) })
	p.start(ctx)
	defer func() { cancel(); p.wait() }()
	if !p.healthy() || p.load().Running != 4 {
		t.Fatalf("healthy %v load %+v", p.healthy(), p.load())
	}
	wait := func(what string, cond func() bool) {
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	healthy.Store(false)
	wait("unhealthy", func() bool { return !p.healthy() })
	healthy.Store(true)
	wait("healthy", p.healthy)
	if restarts.Load() != 0 {
		t.Fatal("a restart reported without one")
	}
	start.Store(2000)
	wait("restart reported", func() bool { return restarts.Load() == 1 })
}

// FuzzParseEngineMetrics: any /metrics body parses without panicking; comments and metrics the
// parser does not read change nothing; and a gauge past a count's range saturates at its
// maximum instead of wrapping (a huge running count never reads as an idle engine).
func FuzzParseEngineMetrics(f *testing.F) {
	f.Add("vllm:num_requests_running{engine=\"0\"} 3\nprocess_start_time_seconds 1.7e9\n")
	f.Add("# HELP x\nsglang:num_queue_reqs -5\nprefixmesh_simengine_free_blocks NaN\n")
	f.Add("vllm:num_requests_waiting{a=\"}\"} +Inf\n")
	f.Add("sglang:num_running_reqs 1e30\n")
	f.Fuzz(func(t *testing.T, body string) {
		started, ld := parseEngineMetrics(strings.NewReader(body))
		padded := "# HELP unrelated a metric the agent ignores\n" + body + "\nunrelated_gauge{x=\"y\"} 7\n"
		if s2, ld2 := parseEngineMetrics(strings.NewReader(padded)); ld2 != ld || (s2 != started && !(math.IsNaN(s2) && math.IsNaN(started))) {
			t.Fatalf("an ignored comment and metric changed the result: %+v %v, then %+v %v", ld, started, ld2, s2)
		}
		if strings.Contains(body, "running") {
			return
		}
		_, huge := parseEngineMetrics(strings.NewReader(body + "\nvllm:num_requests_running 1e30\n"))
		if huge.Running != math.MaxUint32 {
			t.Fatalf("a running gauge of 1e30 read as %d, want the saturated %d", huge.Running, uint32(math.MaxUint32))
		}
	})
}
