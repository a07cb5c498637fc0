package frontdoor

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/cespare/xxhash/v2"

	"github.com/prefixmesh/prefixmesh/router/requests"
)

// hashingEngine is a fake engine that reads each request body through a hash (so it allocates
// next to nothing whatever the body's size), records the hash, and answers a one-choice
// completion.
type hashingEngine struct {
	mu     sync.Mutex // guards hashes
	hashes map[uint64]int
}

func (e *hashingEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := xxhash.New()
	if _, err := io.Copy(h, r.Body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	e.mu.Lock()
	e.hashes[h.Sum64()]++
	e.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"id":"cmpl-1","object":"text_completion","model":"`+simModel+`","choices":[{"index":0,"text":"x","finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
}

// allocatedDuring is the bytes the process allocated while f ran: a bound on the peak heap f
// needed, counted the same way on every machine.
func allocatedDuring(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

func postRaw(t *testing.T, url string, body []byte) (int, []byte) {
	t.Helper()
	resp, err := http.Post(url+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// A body of 256 one-character prompts beside an 8 MB unknown field would send 2 GiB upstream
// if split as is (and held 2 GiB in the router when each copy was re-encoded up front): it is
// refused with 413 before anything is sent, and refusing it costs a few times its size.
func TestBatchAmplificationRefused(t *testing.T) {
	eng := &hashingEngine{hashes: map[uint64]int{}}
	srv := httptestServer(t, eng)
	f := startFrontDoor(t, []requests.NodeTarget{target("fake", srv.URL)}, fleetOpts{})
	f.index.ReplaceNode("fake", 1, 0, nil)

	prompts := make([]string, 256)
	for i := range prompts {
		prompts[i] = "a"
	}
	pj, _ := json.Marshal(prompts)
	pad := strings.Repeat("x", MaxBodyBytes-len(pj)-200)
	body := []byte(`{"model":"` + simModel + `","max_tokens":1,"prompt":` + string(pj) + `,"unknown_field":"` + pad + `"}`)
	var status int
	var resp []byte
	alloc := allocatedDuring(func() { status, resp = postRaw(t, f.srv.URL, body) })
	if status != http.StatusRequestEntityTooLarge || !bytes.Contains(resp, []byte(codeTooLarge)) {
		t.Fatalf("status %d %s, want 413 %s", status, resp, codeTooLarge)
	}
	if len(eng.hashes) != 0 {
		t.Errorf("the engine got %d requests for a refused batch", len(eng.hashes))
	}
	if limit := uint64(4 * len(body)); alloc > limit {
		t.Errorf("refusing an %d-byte batch allocated %d bytes, more than 4× its body (%d)", len(body), alloc, limit)
	}
	t.Logf("refused a %d-byte batch of 256 prompts allocating %.1f MB", len(body), float64(alloc)/1e6)
}

// An 8 MiB batch of 32 token-id prompts is split into 32 requests whose bodies are the batch's
// body with the prompt replaced by one prompt's ids, byte for byte, and the router allocates a
// small multiple of the body in all: the body read once, the prompts' ids (about the body's size
// again, 4 bytes an id) and, on this first request, the index and overlay tables growing; 5.8×
// when measured. Before bodies were views, it re-encoded the whole body once per prompt: 32×.
func TestLargeBatchCostsItsBodyOnce(t *testing.T) {
	eng := &hashingEngine{hashes: map[uint64]int{}}
	srv := httptestServer(t, eng)
	f := startFrontDoor(t, []requests.NodeTarget{target("fake", srv.URL)}, fleetOpts{})
	f.index.ReplaceNode("fake", 1, 0, nil)

	const prompts = 32
	head := `{"model":"` + simModel + `","max_tokens":1,"prompt":`
	tail := `,"temperature":0}`
	items := make([][]byte, prompts)
	per := (MaxBodyBytes - len(head) - len(tail) - 4*prompts) / prompts
	for i := range items {
		var b bytes.Buffer
		b.WriteByte('[')
		for id := 0; b.Len() < per-8; id++ {
			if id > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.Itoa(100000 + (i*7919+id)%50000))
		}
		b.WriteByte(']')
		items[i] = b.Bytes()
	}
	body := []byte(head + "[" + string(bytes.Join(items, []byte(","))) + "]" + tail)
	if len(body) > MaxBodyBytes {
		t.Fatalf("test body %d bytes over the limit", len(body))
	}
	want := map[uint64]int{}
	for _, it := range items {
		want[xxhash.Sum64([]byte(head+string(it)+tail))]++
	}
	var status int
	var resp []byte
	alloc := allocatedDuring(func() { status, resp = postRaw(t, f.srv.URL, body) })
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, resp)
	}
	var merged struct {
		Choices []struct {
			Index int `json:"index"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(resp, &merged); err != nil || len(merged.Choices) != prompts {
		t.Fatalf("merged answer has %d choices (%v), want %d: %.200s", len(merged.Choices), err, prompts, resp)
	}
	eng.mu.Lock()
	got := eng.hashes
	eng.mu.Unlock()
	for h, n := range want {
		if got[h] != n {
			t.Errorf("the engine received %d bodies equal to one prompt's expected body, want %d", got[h], n)
		}
	}
	if limit := uint64(10 * len(body)); alloc > limit {
		t.Errorf("a %d-byte batch of %d prompts allocated %d bytes, more than 10× its body (%d)", len(body), prompts, alloc, limit)
	}
	t.Logf("a %d-byte batch of %d prompts allocated %.1f MB (%.1f× its body)", len(body), prompts, float64(alloc)/1e6, float64(alloc)/float64(len(body)))
}
