package frontdoor

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixmesh/prefixmesh/router/requests"
	"github.com/prefixmesh/prefixmesh/routing"
)

// heapInUse is the live heap after a full collection.
func heapInUse() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// Slow uploads that declare a large body and send one byte hold a chunk each, never their
// declared Content-Length, and all of them together never more than the body budget: the ones
// past it are answered 429 with Retry-After and an OpenAI error at once. Letting go of the
// connections gives every byte back.
func TestSlowUploadsHoldWhatTheySent(t *testing.T) {
	list := &nodeList{}
	list.set([]requests.NodeTarget{target("n0", "http://127.0.0.1:1")})
	reg := prometheus.NewRegistry()
	cfg, sc := DefaultConfig(), requests.DefaultConfig()
	cfg.MaxBodyBytes, sc.MaxBodyBufferBytes = 1<<20, 2<<20
	cfg.BodyTimeout = time.Minute // the held uploads must not time out during the test
	svc := newServiceWith(t, sc, requests.Deps{Picker: newPolicyPicker(t, list, routing.NewIndex(routing.DefaultIndexConfig()))})
	fd, err := New(cfg, Deps{Service: svc, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	front := httptestServer(t, fd.Handler())
	addr := strings.TrimPrefix(front.URL, "http://")
	const conns, declared = 64, 1_000_000
	held := int(sc.MaxBodyBufferBytes / bodyChunkBytes) // uploads the budget holds a chunk of
	before := heapInUse()
	answers := make(chan *http.Response, conns)
	var cs []net.Conn
	for range conns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
		t.Cleanup(func() { c.Close() })
		fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{", declared)
		go func() {
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				return // closed by the test: a held upload
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body = io.NopCloser(bytes.NewReader(b))
			answers <- resp
		}()
	}
	for i := range conns - held {
		resp := recv(t, fmt.Sprintf("refusal %d", i), answers)
		var e apiError
		if err := json.NewDecoder(resp.Body).Decode(&e); err != nil || resp.StatusCode != http.StatusTooManyRequests ||
			resp.Header.Get("Retry-After") == "" || e.Error.Code != codeOverloaded || e.Error.Type != "rate_limit_error" {
			t.Fatalf("over the budget: %d %v %+v (%v), want 429 with Retry-After and an OpenAI error", resp.StatusCode, resp.Header, e, err)
		}
	}
	eventually(t, "the held uploads to fill the budget", func() bool {
		return svc.Bodies().Held() == sc.MaxBodyBufferBytes && fd.InFlight() == held
	})
	grew := int64(heapInUse()) - int64(before)
	t.Logf("%d uploads of 1 byte declaring %d: %d held (%d bytes charged), %d refused; heap +%d bytes",
		conns, declared, held, svc.Bodies().Held(), conns-held, grew)
	// The budget, plus what 64 connections and their goroutines cost (buffers, stacks).
	if limit := sc.MaxBodyBufferBytes + 3<<20; grew > limit {
		t.Fatalf("heap grew %d bytes for %d one-byte uploads, want at most %d", grew, conns, limit)
	}
	if got := counterWith(t, &fleet{reg: reg}, "prefixmesh_frontdoor_rejected_total", map[string]string{"reason": reasonBodyBudget}); got != float64(conns-held) {
		t.Fatalf("rejected_total{reason=%q} = %v, want %d", reasonBodyBudget, got, conns-held)
	}
	for _, c := range cs {
		c.Close()
	}
	eventually(t, "every byte given back", func() bool { return svc.Bodies().Held() == 0 && fd.InFlight() == 0 })
}

// Bodies longer than a chunk, or of unknown length, read in chunks arrive whole and unchanged,
// and their bytes go back to the budget with the request.
func TestChunkedBodiesArriveWhole(t *testing.T) {
	got := make(chan []byte, 4)
	eng := httptestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- b
		okEngine{}.ServeHTTP(w, r)
	}))
	list := &nodeList{}
	list.set([]requests.NodeTarget{target("n0", eng.URL)})
	svc := newService(t, newPolicyPicker(t, list, routing.NewIndex(routing.DefaultIndexConfig())))
	fd, err := New(DefaultConfig(), Deps{Service: svc, Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	front := httptestServer(t, fd.Handler())
	for _, n := range []int{bodyChunkBytes / 4, 3*bodyChunkBytes + 17, 2 << 20} {
		for _, known := range []bool{true, false} {
			body := idsBody(n / 2)
			var rd io.Reader = bytes.NewReader(body)
			if !known {
				rd = io.MultiReader(rd) // no length: sent chunked
			}
			resp, err := http.Post(front.URL+"/v1/completions", "application/json", rd)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%d-byte body (length known %v): %d", len(body), known, resp.StatusCode)
			}
			if b := recv(t, "the engine's body", got); !bytes.Equal(b, body) {
				t.Fatalf("%d-byte body (length known %v) arrived as %d bytes", len(body), known, len(b))
			}
			eventually(t, "the body's bytes given back", func() bool { return svc.Bodies().Held() == 0 })
		}
	}
}
