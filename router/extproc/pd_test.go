package extproc

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	procv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"

	"github.com/prefixmesh/prefixmesh/local"
	"github.com/prefixmesh/prefixmesh/router/extproc/fakegw"
	"github.com/prefixmesh/prefixmesh/routing"
)

// A disaggregated request through the endpoint picker: the destination is the decode node and
// x-prefiller-host-port names the prefill node's ip:port, as llm-d's router tells its P/D
// sidecar on the decode pod (llm-d-router pkg/common/routing/common.go), which then runs the
// prefill leg itself.
func TestPickerNamesPrefiller(t *testing.T) {
	var mu sync.Mutex
	var seen, sources []string
	prefill := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		t.Error("the gateway sent the request to the prefill node: the sidecar on the decode node does that")
		w.WriteHeader(http.StatusInternalServerError)
	})
	decode := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get(HeaderPrefiller))
		sources = append(sources, r.Header.Get(HeaderKVSource))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"x","object":"text_completion","choices":[{"index":0,"text":"ok","finish_reason":"length"}]}`))
	})
	for _, tc := range []struct {
		mode routing.DisaggMode
		want bool
	}{{routing.DisaggAlways, true}, {routing.DisaggNever, false}} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			mu.Lock()
			seen, sources = nil, nil
			mu.Unlock()
			r := newRig(t, rigOpts{nodes: 2, engines: map[int]http.Handler{0: prefill, 1: decode},
				roles: map[int]routing.Role{0: routing.RolePrefill, 1: routing.RoleDecode}, disagg: tc.mode})
			g, base := r.gateway(fakegw.Config{RequestMode: procv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseMode: procv3.ProcessingMode_FULL_DUPLEX_STREAMED})
			ids := strings.TrimSuffix(strings.Repeat("1000,", 128), ",") // token ids: exact here
			// The client sends both hints itself: the picker's own replaces or removes them.
			status, body := postHinted(t, base, `{"model":"`+simModel+`","prompt":[`+ids+`],"max_tokens":4}`)
			if status != http.StatusOK {
				t.Fatalf("status %d: %s", status, body)
			}
			d := decision(t, g, 1)
			if want := strings.TrimPrefix(r.list.nodes[1].EngineURL, "http://"); d.Destination != want {
				t.Fatalf("destination %q, want the decode node %q", d.Destination, want)
			}
			mu.Lock()
			defer mu.Unlock()
			want := ""
			if tc.want {
				want = strings.TrimPrefix(r.list.nodes[0].EngineURL, "http://")
			}
			if len(seen) != 1 || seen[0] != want {
				t.Fatalf("%s on the decode request: %q, want %q", HeaderPrefiller, seen, want)
			}
			if sources[0] != "" {
				t.Fatalf("the client's %s reached the engine: %q", HeaderKVSource, sources[0])
			}
			// The prefill leg's count on the prefill node ends with the request.
			eventually(t, "in-flight back to zero", func() error {
				if n := r.picker.InFlight("node-0"); n != 0 {
					return errInFlight(n)
				}
				return nil
			})
		})
	}
}

type errInFlight int

func (e errInFlight) Error() string { return "prefill node still has requests in flight" }

// A peer pull through the endpoint picker: the holder of the prompt (node-1) is busy, so the
// destination is the idle node-0 and x-kv-cache-source-host-port names the holder's KV endpoint,
// as llm-d's router tells its sidecar (pkg/common/routing/common.go).
func TestPickerNamesKVSource(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	idle := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get(HeaderKVSource))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"x","object":"text_completion","choices":[{"index":0,"text":"ok","finish_reason":"length"}]}`))
	})
	busy := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		t.Error("the busy holder was chosen")
		w.WriteHeader(http.StatusInternalServerError)
	})
	r := newRig(t, rigOpts{nodes: 2, engines: map[int]http.Handler{0: idle, 1: busy},
		peers: map[int]string{1: "10.9.8.7:5600"}, queued: map[int]int{1: 200000}})
	ids := make([]uint32, 2048)
	parts := make([]string, len(ids))
	for i := range ids {
		ids[i] = uint32(1000 + i)
		parts[i] = strconv.Itoa(int(ids[i]))
	}
	r.index.ReplaceNode("node-1", 9, 1, local.BlockHashes(ids, 16, 0))
	g, base := r.gateway(fakegw.Config{RequestMode: procv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseMode: procv3.ProcessingMode_FULL_DUPLEX_STREAMED})
	status, _, body := post(t, base, "/v1/completions", `{"model":"`+simModel+`","prompt":[`+strings.Join(parts, ",")+`],"max_tokens":4}`)
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, body)
	}
	if d := decision(t, g, 1); strings.Split(d.Destination, ",")[0] != strings.TrimPrefix(r.list.nodes[0].EngineURL, "http://") {
		t.Fatalf("destination %q, want the idle node-0 first", d.Destination)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 || seen[0] != "10.9.8.7:5600" {
		t.Fatalf("%s: %q, want the holder's KV endpoint", HeaderKVSource, seen)
	}
}

// postHinted posts a completion through the gateway with the llm-d hints a client should not
// be able to set.
func postHinted(t *testing.T, base, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/v1/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(HeaderPrefiller, "169.254.169.254:80")
	req.Header.Set(HeaderKVSource, "169.254.169.254:80")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
