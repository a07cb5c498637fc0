package frontdoor

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixmesh/prefixmesh/internal/tokenizer"
	"github.com/prefixmesh/prefixmesh/local"
	"github.com/prefixmesh/prefixmesh/router/requests"
	"github.com/prefixmesh/prefixmesh/routing"
	"github.com/prefixmesh/prefixmesh/routing/sim"
	"github.com/prefixmesh/prefixmesh/tokenizer/tokenizertest"
)

// Realistic upstream for the overhead benchmark: it reads the body, waits a fixed TTFT, then
// streams benchChunks SSE chunks and [DONE], flushing each.
const (
	benchTTFT   = time.Millisecond
	benchChunks = 8
)

func realisticUpstream() http.Handler {
	chunk := []byte(`data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"prefixmesh-sim","choices":[{"index":0,"text":" word","logprobs":null,"finish_reason":null}]}` + "\n\n")
	last := []byte(`data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"prefixmesh-sim","choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":8192,"completion_tokens":8,"total_tokens":8200,"prompt_tokens_details":{"cached_tokens":0}}}` + "\n\ndata: [DONE]\n\n")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		time.Sleep(benchTTFT)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set(requests.HeaderCachedTokens, "0")
		rc := http.NewResponseController(w)
		for range benchChunks - 1 {
			_, _ = w.Write(chunk)
			_ = rc.Flush()
		}
		_, _ = w.Write(last)
	})
}

// benchBodies are the two 8k-token prompts: token ids, and text that cl100k_base tokenises to
// about 8k tokens (the front door tokenises it on every request).
func benchBodies(b *testing.B) (ids, text []byte) {
	tok, err := tokenizer.New(tokenizer.CL100kBase)
	if err != nil {
		b.Fatal(err)
	}
	toks8k := tok.Encode(benchText())
	if len(toks8k) < 8192 {
		b.Fatalf("text prompt has only %d tokens", len(toks8k))
	}
	prompt := tok.Decode(toks8k[:8192])
	text, _ = json.Marshal(map[string]any{"model": simModel, "prompt": prompt, "max_tokens": benchChunks, "stream": true})
	toks := make([]int, 8192)
	for i := range toks {
		toks[i] = 1000 + (i*7919)%90000
	}
	ids, _ = json.Marshal(map[string]any{"model": simModel, "prompt": toks, "max_tokens": benchChunks, "stream": true})
	return ids, text
}

// benchText is text that cl100k_base tokenises to more than 8k tokens (router/extproc's
// benchmarks tokenise the same).
func benchText() string {
	var sb strings.Builder
	for i := 0; i < 600; i++ { // ~16 tokens a sentence: enough for 8k tokens
		fmt.Fprintf(&sb, "Request %d asks the router which node caches the longest prefix of this prompt. ", i)
	}
	return sb.String()
}

// BenchmarkOverhead is the front door's added latency and CPU against calling the same realistic
// upstream directly, in the same run, for an 8k-token token-id prompt and an 8k-token text
// prompt tokenised by cl100k_base and, when their files are fetched, by Llama-3.1's and Qwen3's
// Hugging Face tokenizers:
//
//	serial   one client; direct and front-door requests alternate, so load hits both alike;
//	         reports each one's p50/p99 and the difference (added-p50-µs, added-p99-µs)
//	paced1k  64 clients sending 1,000 req/s in total (open loop), alternating likewise, in
//	         overheadRounds rounds: the added p50 and p99 as median, min and max over rounds
//	c64      rounds of 64 clients as fast as they go, direct then through the front door: the
//	         process CPU (fd-cpu-*-µs/req), heap allocations (fd-allocs/req-*) and kilobytes
//	         (fd-KB/req-*) per request beyond the direct round's, as median, min and max over
//	         rounds; routed-req/s/core is the inverse of the median CPU
//
// CPU and allocations say more than latency on a shared machine: a loaded neighbour moves the
// paced p50 by hundreds of µs but the CPU per request by tens, and the allocation counts not at all.
func BenchmarkOverhead(b *testing.B) {
	up := httptest.NewServer(realisticUpstream())
	defer up.Close()
	frontFor := func(tok string) string { return benchFrontDoor(b, up.URL, 4, tok) }
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true}}
	post := func(url string, body []byte) time.Duration {
		start := time.Now()
		resp, err := client.Post(url+"/v1/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("status %d", resp.StatusCode)
		}
		return time.Since(start)
	}
	ids, text := benchBodies(b)
	cl100k := frontFor(tokenizer.CL100kBase)
	kinds := []struct {
		name  string
		body  []byte
		front string
	}{{"ids8k", ids, cl100k}, {"text8k", text, cl100k}}
	// The Hugging Face tokenizers the router runs for real models, on the same text, when their
	// files are fetched (scripts/fetch-tokenizers.sh).
	for _, m := range []string{"llama3_1", "qwen3"} {
		dir := filepath.Join(tokenizertest.Root(), m)
		if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err == nil {
			kinds = append(kinds, struct {
				name  string
				body  []byte
				front string
			}{"text8k-" + m, text, frontFor(tokenizer.HFPrefix + dir)})
		}
	}
	for _, kind := range kinds {
		b.Run("serial/"+kind.name, func(b *testing.B) {
			var direct, via []time.Duration
			for b.Loop() {
				direct = append(direct, post(up.URL, kind.body))
				via = append(via, post(kind.front, kind.body))
			}
			reportPair(b, direct, via)
		})
		b.Run("paced1k/"+kind.name, func(b *testing.B) {
			// overheadRounds rounds, each its own paced run with direct and front-door requests
			// alternating: the spread of the added p50 over rounds says how much is the machine.
			var added50, added99 []time.Duration
			var allDirect, allVia []time.Duration
			for range overheadRounds {
				direct, via := paced(b, 1000, 64, func(i int) (time.Duration, bool) {
					if i%2 == 0 {
						return post(up.URL, kind.body), false
					}
					return post(kind.front, kind.body), true
				})
				added50 = append(added50, percentile(via, 50)-percentile(direct, 50))
				added99 = append(added99, percentile(via, 99)-percentile(direct, 99))
				allDirect, allVia = append(allDirect, direct...), append(allVia, via...)
			}
			reportPair(b, allDirect, allVia)
			reportSpread(b, "added-p50-µs", added50)
			reportSpread(b, "added-p99-µs", added99)
		})
		b.Run("c64/"+kind.name, func(b *testing.B) {
			// Rounds of 64 clients as fast as they go, direct then through the front door: the
			// process CPU, allocations and bytes per request beyond the direct round's, per round.
			n := max(b.N/overheadRounds, 64)
			var cpu, allocs, kb []time.Duration
			var reqs, wall float64
			for range overheadRounds {
				d := closedLoop(n, 64, func() { post(up.URL, kind.body) })
				v := closedLoop(n, 64, func() { post(kind.front, kind.body) })
				cpu = append(cpu, (v.cpu-d.cpu)/time.Duration(n))
				allocs = append(allocs, time.Duration((int64(v.mallocs)-int64(d.mallocs))/int64(n)))
				kb = append(kb, time.Duration((int64(v.bytes)-int64(d.bytes))/int64(n)/1000))
				reqs += float64(n)
				wall += v.wall.Seconds()
			}
			b.ReportMetric(reqs/wall, "fd-req/s")
			reportSpread(b, "fd-cpu-µs/req", cpu)
			slices.Sort(cpu)
			if med := cpu[len(cpu)/2]; med > 0 {
				b.ReportMetric(float64(time.Second)/float64(med), "routed-req/s/core")
			}
			reportCount(b, "fd-allocs/req", allocs)
			reportCount(b, "fd-KB/req", kb)
			b.ReportMetric(0, "ns/op")
		})
	}
}

// overheadRounds is how many alternating rounds the paced and closed-loop cases run: enough for
// a median and a range that show how much of a figure is the machine.
const overheadRounds = 5

// reportSpread reports the median, min and max of durations, in µs.
func reportSpread(b *testing.B, name string, ds []time.Duration) {
	s := slices.Clone(ds)
	slices.Sort(s)
	unit := strings.TrimSuffix(name, "-µs/req")
	unit = strings.TrimSuffix(unit, "-µs")
	suffix := strings.TrimPrefix(name, unit)
	b.ReportMetric(float64(s[len(s)/2].Microseconds()), unit+"-med"+suffix)
	b.ReportMetric(float64(s[0].Microseconds()), unit+"-min"+suffix)
	b.ReportMetric(float64(s[len(s)-1].Microseconds()), unit+"-max"+suffix)
}

// reportCount reports the median, min and max of counts carried in durations' integer values.
func reportCount(b *testing.B, name string, cs []time.Duration) {
	s := slices.Clone(cs)
	slices.Sort(s)
	b.ReportMetric(float64(s[len(s)/2]), name+"-med")
	b.ReportMetric(float64(s[0]), name+"-min")
	b.ReportMetric(float64(s[len(s)-1]), name+"-max")
}

// reportPair reports both runs' p50/p99 and the front door's additions.
func reportPair(b *testing.B, direct, via []time.Duration) {
	dp50, dp99 := percentile(direct, 50), percentile(direct, 99)
	fp50, fp99 := percentile(via, 50), percentile(via, 99)
	b.ReportMetric(float64(dp50.Microseconds()), "direct-p50-µs")
	b.ReportMetric(float64(dp99.Microseconds()), "direct-p99-µs")
	b.ReportMetric(float64(fp50.Microseconds()), "fd-p50-µs")
	b.ReportMetric(float64(fp99.Microseconds()), "fd-p99-µs")
	b.ReportMetric(float64((fp50 - dp50).Microseconds()), "added-p50-µs")
	b.ReportMetric(float64((fp99 - dp99).Microseconds()), "added-p99-µs")
	b.ReportMetric(0, "ns/op")
}

// percentile is sim.Percentile of unsorted latencies.
func percentile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return sim.Percentile(s, p)
}

// paced sends b.N×2 requests (at least 2,000) at rate req/s in total from at most workers
// concurrent senders (open loop: a request's start does not wait for the previous one's end),
// and splits the latencies by what f reports.
func paced(b *testing.B, rate, workers int, f func(i int) (time.Duration, bool)) (direct, via []time.Duration) {
	n := max(2*b.N, 2000)
	var mu sync.Mutex // guards direct, via
	sem := make(chan struct{}, workers)
	var wg sync.WaitGroup
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	for i := range n {
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
			time.Sleep(d)
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			lat, isVia := f(i)
			mu.Lock()
			if isVia {
				via = append(via, lat)
			} else {
				direct = append(direct, lat)
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	return direct, via
}

// loopCost is what a closed-loop run cost the process: CPU time, wall time, heap allocations
// and bytes allocated.
type loopCost struct {
	cpu, wall      time.Duration
	mallocs, bytes uint64
}

// closedLoop runs f n times from workers goroutines and returns what it cost the process.
func closedLoop(n, workers int, f func()) loopCost {
	next := make(chan struct{}, n)
	for range n {
		next <- struct{}{}
	}
	close(next)
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	c0 := processCPU()
	start := time.Now()
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range next {
				f()
			}
		}()
	}
	wg.Wait()
	c := loopCost{cpu: processCPU() - c0, wall: time.Since(start)}
	runtime.ReadMemStats(&m1)
	c.mallocs, c.bytes = m1.Mallocs-m0.Mallocs, m1.TotalAlloc-m0.TotalAlloc
	return c
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkPromptGrowth is the memory a request allocates as its token-id prompt grows from 1k to
// 8k tokens, through the front door and directly to the same upstream, with the parser's own
// allocations (internal/openai.ParseCompletion on the same body, without handing its ids back)
// measured beside them: the front door's growth minus the direct path's is what it adds that
// grows with the prompt. The body buffer (held for a retry), the upstream body copy and the
// parsed ids are pooled (body.go, openai.ReleaseIDs), so that difference is near zero; the
// parser's own row shows what parsing allocates when nothing is handed back.
func BenchmarkPromptGrowth(b *testing.B) {
	up := httptest.NewServer(realisticUpstream())
	defer up.Close()
	list := &nodeList{}
	list.set([]requests.NodeTarget{target("n0", up.URL), target("n1", up.URL)})
	pol, err := routing.NewPolicy(routing.PolicyPrefixMesh, routing.DefaultPolicyConfig())
	if err != nil {
		b.Fatal(err)
	}
	picker, err := requests.NewPolicyPicker(list, routing.NewIndex(routing.DefaultIndexConfig()), routing.NewOverlay(0, 0), pol, requests.PolicyPickerConfig{})
	if err != nil {
		b.Fatal(err)
	}
	fd, err := New(DefaultConfig(), Deps{Service: newService(b, picker)})
	if err != nil {
		b.Fatal(err)
	}
	front := httptest.NewServer(fd.Handler())
	defer front.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	for _, n := range []int{1024, 8192} {
		toks := make([]int, n)
		for i := range toks {
			toks[i] = 1000 + (i*7919)%90000
		}
		body, _ := json.Marshal(map[string]any{"model": simModel, "prompt": toks, "max_tokens": benchChunks, "stream": true})
		for _, c := range []struct{ name, url string }{{"direct", up.URL}, {"frontdoor", front.URL}} {
			b.Run(fmt.Sprintf("%s/ids%dk", c.name, n/1024), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					resp, err := client.Post(c.url+"/v1/completions", "application/json", bytes.NewReader(body))
					if err != nil {
						b.Fatal(err)
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			})
		}
		b.Run(fmt.Sprintf("parse/ids%dk", n/1024), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := requests.ParseGen(body, false, http.Header{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkOverheadPath is one 8k-token-id request on each of its paths, one path per run, so
// that a tool counting a whole process's instructions (valgrind --tool=callgrind, which the
// machine's load does not move) can take the difference of two runs of different lengths as one
// request's cost (scripts/bench-frontdoor-instructions.sh does):
//
//	hash    the prompt's block hashes alone (local.AppendBlockHashes): the floor
//	picker  the front door's picker alone on the prompt's ids, Pick and Done: router/extproc's
//	        BenchmarkDecision "picker", the endpoint picker's own cost
//	first   the same with FirstToken between them, as a proxied request drives it (the
//	        overlay moves the prompt's pending blocks to its recent table)
//	direct  the request straight to the upstream
//	front   the same through the front door; front minus direct is what the front door adds
//
// Each reports ns/op, the process's CPU time per request (cpu-µs/op) and -benchmem's counts.
// The fleet and the prompt are BenchmarkDecision's (benchFleet): 16 nodes, each holding a
// different length of the prompt's prefix in the index, and cl100k_base's ids of the same text,
// so that the doors' figures compare.
func BenchmarkOverheadPath(b *testing.B) {
	up := httptest.NewServer(realisticUpstream())
	defer up.Close()
	f := newBenchFleet(b, up.URL)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4, DisableCompression: true}}
	b.Run("hash/ids8k", func(b *testing.B) {
		dst := make([]uint64, 0, len(f.toks)/benchBlockSize)
		b.ReportAllocs()
		defer reportCPUPerOp(b, processCPU())
		for b.Loop() {
			dst = local.AppendBlockHashes(dst[:0], f.toks, benchBlockSize, 0)
		}
	})
	for _, c := range []struct {
		name  string
		first bool
	}{{"picker", false}, {"first", true}} {
		b.Run(c.name+"/ids8k", func(b *testing.B) {
			req := &requests.PickRequest{Tokens: f.toks, Model: simModel}
			b.ReportAllocs()
			defer reportCPUPerOp(b, processCPU())
			for b.Loop() {
				pk, err := f.picker.Pick(b.Context(), req, nil)
				if err != nil {
					b.Fatal(err)
				}
				if c.first && pk.FirstToken != nil {
					pk.FirstToken()
				}
				pk.Done(requests.Outcome{Status: http.StatusOK, CachedTokens: -1})
			}
		})
	}
	for _, path := range []struct{ name, url string }{{"direct", up.URL}, {"front", f.frontURL}} {
		b.Run(path.name+"/ids8k", func(b *testing.B) {
			b.ReportAllocs()
			defer reportCPUPerOp(b, processCPU())
			for b.Loop() {
				resp, err := client.Post(path.url+"/v1/completions", "application/json", bytes.NewReader(f.ids))
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Fatalf("status %d", resp.StatusCode)
				}
			}
		})
	}
}

// reportCPUPerOp reports the process's CPU time (user and system, every goroutine) per
// iteration since c0, in µs: beside ns/op, what a request costs whatever it waited for.
func reportCPUPerOp(b *testing.B, c0 time.Duration) {
	b.ReportMetric(float64((processCPU()-c0).Nanoseconds())/1e3/float64(max(b.N, 1)), "cpu-µs/op")
}

// benchBlockSize is the bench fleet's block size in tokens (the simulated engine's).
const benchBlockSize = 16

// benchFleet is router/extproc's BenchmarkDecision fleet behind a front door: a request service
// over 16 nodes that all proxy to one upstream, each holding a different length of the prompt's
// prefix in the index, and the prompt (cl100k_base's ids of benchBodies' text) as ids and as a
// streaming completions body.
type benchFleet struct {
	picker   *requests.PolicyPicker
	frontURL string
	toks     []uint32
	ids      []byte
}

func newBenchFleet(b *testing.B, upstreamURL string) *benchFleet {
	const nodes = 16
	tok, err := tokenizer.New(tokenizer.CL100kBase)
	if err != nil {
		b.Fatal(err)
	}
	toks := tok.Encode(benchText())[:8192]
	ids, _ := json.Marshal(map[string]any{"model": simModel, "prompt": toks, "max_tokens": benchChunks, "stream": true})
	hashes := local.BlockHashes(toks, benchBlockSize, 0)
	list := &nodeList{}
	idx := routing.NewIndex(routing.DefaultIndexConfig())
	var targets []requests.NodeTarget
	for i := range nodes {
		id := fmt.Sprintf("node-%02d", i)
		targets = append(targets, target(id, upstreamURL))
		idx.ReplaceNode(id, 1, 1, hashes[:i*len(hashes)/nodes])
	}
	list.set(targets)
	f := &benchFleet{picker: newPolicyPicker(b, list, idx), toks: toks, ids: ids}
	svc := newServiceWith(b, requests.DefaultConfig(), requests.Deps{Picker: f.picker})
	fd, err := New(DefaultConfig(), Deps{Service: svc, Registry: prometheus.NewRegistry()})
	if err != nil {
		b.Fatal(err)
	}
	front := httptest.NewServer(fd.Handler())
	b.Cleanup(front.Close)
	f.frontURL = front.URL
	return f
}
