package frontdoor

import (
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixmesh/prefixmesh/router/requests"
	"github.com/prefixmesh/prefixmesh/routing"
)

// cutEngine answers every request with a 200 whose Content-Length promises more than it sends,
// then closes the connection: a plain (non-streaming) answer cut by the engine.
type cutEngine struct{}

func (cutEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", "100")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte(`{"id":"x",`))
	_ = http.NewResponseController(w).Flush()
	conn, _, err := http.NewResponseController(w).Hijack()
	if err == nil {
		conn.Close()
	}
}

// serveCut runs one request through h and reports whether the front door aborted the
// response, as it must for a plain body cut after it began (net/http recovers this panic).
func serveCut(h http.Handler, body string) (aborted bool) {
	defer func() {
		if p := recover(); p != nil {
			if p != http.ErrAbortHandler { //nolint:errorlint // the sentinel is panicked as is
				panic(p)
			}
			aborted = true
		}
	}()
	r := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	h.ServeHTTP(httptest.NewRecorder(), r)
	return false
}

// Every attempt ends (its timers stopped, its hook on the server's stop context removed) on
// every path, the abort of a plain answer the engine cut included: 20,000 such answers leave
// the heap where it was, save a small constant.
func TestCutAnswersDoNotLeak(t *testing.T) {
	eng := httptestServer(t, cutEngine{})
	list := &nodeList{}
	list.set([]requests.NodeTarget{target("n0", eng.URL)})
	fd, err := New(DefaultConfig(), Deps{Service: newService(t, newPolicyPicker(t, list, routing.NewIndex(routing.DefaultIndexConfig()))), Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	h := fd.Handler()
	body := `{"model":"` + simModel + `","prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17],"max_tokens":4}`
	run := func(n int) {
		t.Helper()
		for i := range n {
			if !serveCut(h, body) {
				t.Fatalf("request %d: the cut answer was not aborted", i)
			}
		}
	}
	heap := func() uint64 {
		var ms runtime.MemStats
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	run(1000) // warm pools, connections and metric series
	before := heap()
	const n = 20000
	run(n)
	after := heap()
	// Before the fix each cut answer kept ~1.4 KB until shutdown: ~27 MB here.
	const slack = 2 << 20
	grew := int64(after) - int64(before)
	t.Logf("heap %d -> %d bytes over %d cut answers (%+d, %.1f B each)", before, after, n, grew, float64(grew)/n)
	if grew > slack {
		t.Fatalf("heap grew %d bytes over %d cut answers (%.0f B each), want at most %d: attempts leak", grew, n, float64(grew)/n, slack)
	}
}
