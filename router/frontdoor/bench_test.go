package frontdoor

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prefixmesh/prefixmesh/router/requests"
)

// benchPrompt is a ~200-token text prompt, tokenised by the front door on every request.
var benchPrompt = strings.Repeat("The router hashes the prompt into blocks and asks the index. ", 16)

// BenchmarkProxy measures requests per second through the front door to a trivial upstream (a
// fixed small JSON answer), against the same upstream called directly in the same run: the
// difference is the front door's overhead (read, parse, tokenise, route, forward, relay, log,
// metrics). "frontdoor-text" sends a ~200-token text prompt the front door tokenises with
// cl100k_base; "frontdoor-ids" the same length as token ids, which skips the tokenizer. "parallel"
// runs 8 clients per CPU.
func BenchmarkProxy(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set(requests.HeaderCachedTokens, "0")
		_, _ = io.WriteString(w, okCompletion)
	}))
	defer up.Close()
	frontURL := benchFrontDoor(b, up.URL, 4, "")
	textBody := []byte(fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":1}`, simModel, benchPrompt))
	ids := make([]int, 200)
	for i := range ids {
		ids[i] = 1000 + i
	}
	idsBody, _ := json.Marshal(map[string]any{"model": simModel, "prompt": ids, "max_tokens": 1})
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024}}
	post := func(b *testing.B, url string, body []byte) {
		resp, err := client.Post(url+"/v1/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("status %d", resp.StatusCode)
		}
	}
	for _, c := range []struct {
		name, url string
		body      []byte
	}{{"direct", up.URL, textBody}, {"frontdoor-text", frontURL, textBody}, {"frontdoor-ids", frontURL, idsBody}} {
		b.Run("serial/"+c.name, func(b *testing.B) {
			start := time.Now()
			for b.Loop() {
				post(b, c.url, c.body)
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
		})
		b.Run("parallel/"+c.name, func(b *testing.B) {
			b.SetParallelism(8)
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					post(b, c.url, c.body)
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
		})
	}
}
