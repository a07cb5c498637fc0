package frontdoor

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prefixmesh/prefixmesh/router/requests"
)

// sseUpstream sends one chunk, waits for release, then finishes the stream.
type sseUpstream struct{ *blockingUpstream }

func (s sseUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.arrived.Add(1)
	w.Header().Set("Content-Type", "text/event-stream")
	_, _ = io.WriteString(w, "data: {\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\"first\"}]}\n\n")
	http.NewResponseController(w).Flush()
	select {
	case <-s.release:
	case <-r.Context().Done():
		return
	}
	_, _ = io.WriteString(w, "data: {\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\" last\",\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n")
}

// startServing serves f's front door on a real listener via Start.
func startServing(t *testing.T, f *fleet) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.fd.Start(t.Context(), ln)
	return "http://" + ln.Addr().String()
}

// Shutdown drains: new requests get 503 with Connection: close while a stream in flight runs to
// its end; then the listener closes.
func TestShutdownDrains(t *testing.T) {
	up := sseUpstream{newBlockingUpstream()}
	f := startFrontDoor(t, []requests.NodeTarget{target("n", httptestServer(t, up).URL)}, fleetOpts{})
	base := startServing(t, f)
	streamDone := make(chan *result, 1)
	go func() {
		r, err := do(context.Background(), &http.Client{}, base, "/v1/completions", `{"prompt":"x","stream":true}`, nil)
		if err != nil {
			r = nil
		}
		streamDone <- r
	}()
	eventually(t, "the stream to start", func() bool { return up.arrived.Load() == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	shut := make(chan error, 1)
	go func() { shut <- f.fd.Shutdown(ctx) }()
	eventually(t, "draining to start", f.svc.Draining)

	resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"y"}`))
	if err != nil {
		t.Fatal(err)
	}
	if !resp.Close { // the client consumed the "Connection: close" header
		t.Fatalf("draining answer without Connection: close: %v", resp.Header)
	}
	checkError(t, "draining", resp, http.StatusServiceUnavailable, codeDraining, "shutting down")
	hz, err := http.Get(base + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	hz.Body.Close()
	if hz.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("healthz while draining: %d", hz.StatusCode)
	}
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned %v with a stream in flight", err)
	default:
	}
	up.open()
	if r := recv(t, "the in-flight stream", streamDone); r == nil || !r.done || r.text != "first last" {
		t.Fatalf("in-flight stream: %+v", r)
	}
	if err := recv(t, "Shutdown", shut); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if _, err := http.Get(base + "/healthz"); err == nil {
		t.Fatal("listener still open after Shutdown")
	}
}

// A drain that outlives its deadline returns the context's error and cuts the streams still
// running (their upstream requests are cancelled).
func TestShutdownDeadline(t *testing.T) {
	up := sseUpstream{newBlockingUpstream()}
	defer up.open()
	f := startFrontDoor(t, []requests.NodeTarget{target("n", httptestServer(t, up).URL)}, fleetOpts{})
	base := startServing(t, f)
	streamDone := make(chan error, 1)
	go func() {
		_, err := do(context.Background(), &http.Client{}, base, "/v1/completions", `{"prompt":"x","stream":true}`, nil)
		streamDone <- err
	}()
	eventually(t, "the stream to start", func() bool { return up.arrived.Load() == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := f.fd.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown = %v, want deadline exceeded", err)
	}
	// The cut stream ends with an SSE error event, not a bare EOF.
	if err := recv(t, "the cut stream's client", streamDone); err == nil || !strings.Contains(err.Error(), "stream error event") ||
		!strings.Contains(err.Error(), "shut down") {
		t.Fatalf("cut stream: %v, want an SSE error event", err)
	}
	eventually(t, "the front door's request to end", func() bool { return f.fd.InFlight() == 0 })
	if got := brokenByCause(t, f, "n", causeDrain); got != 1 {
		t.Fatalf("broken_streams{n,drain} = %v", got)
	}
}
