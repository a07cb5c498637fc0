package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestPDEndToEnd is prefill/decode disaggregation over real daemons: a prefill node and a decode
// node (simulated engines with vLLM's NixlConnector behaviour and their KV side channels on
// loopback, agents with --role prefill|decode --kv-connector nixl) and a router with
// --disaggregate always, whose front door drives both legs.
//
//   - A completion and a streamed chat completion succeed through the front door: the prefill
//     leg ran on the prefill node (X-Prefixmesh-Prefill-Node), the answer came from the decode
//     node (X-Prefixmesh-Node).
//   - The decode engine really pulled: its own counters show prompt − its own hit tokens pulled
//     from the prefill engine's lease, and the prefill engine's lease is released by the pull.
//   - The client is told what the prefill engine's cache saved, not the decode engine's count
//     (vLLM reports every pulled token as cached: prompt − 1). A prompt sharing a system prompt
//     with an earlier one finds it cached on the prefill engine (its cached_tokens > 0 and
//     < prompt − 1), while the decode engine reports prompt − 1.
//   - The prefill engine stops: the next request still succeeds, prefilled by the decode engine
//     itself, and the router counts the failed prefill leg.
//
// The same prompt is not sent twice through the router for the cached case: the decode engine
// keeps the KV it pulled, so the second time it lacks nothing and the router (once its KV events
// arrive) serves it whole. A new suffix after the shared system prompt is disaggregated
// whatever the router has heard.
func TestPDEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 2-node P/D cluster")
	}
	cfg := defaultDemoConfig()
	cfg.Nodes = 2
	cfg.Roles = []string{"prefill", "decode"}
	cfg.Disaggregate = "always"
	cfg.PrefillPerSec = 400000
	cfg.DecodePerSec = 4000
	ctx, cl := startE2ECluster(t, cfg)
	pre, dec := cl.nodes[0], cl.nodes[1]
	if pre.role != "prefill" || dec.role != "decode" {
		t.Fatalf("roles %q, %q", pre.role, dec.role)
	}
	router := "http://" + cl.httpAddr
	system := seqIDs(512, 1000) // 32 blocks of 16
	legs := func(outcome string) float64 {
		return scrapeSamples(t, ctx, router+"/metrics")[`prefixmesh_frontdoor_prefill_legs_total{outcome="`+outcome+`"}`]
	}

	// 1. A cold completion: the prefill engine computes the whole prompt, the decode engine pulls
	// all of it (its own hit is 0) and reports prompt − 1 as cached; the client hears 0.
	p1 := append(append([]uint32(nil), system...), seqIDs(40, 9000)...) // 552 tokens
	r1 := pdStep(t, ctx, cl, func() pdAnswer { return pdComplete(t, ctx, router, p1) })
	r1.check(t, pre.id, dec.id)
	if r1.ans.prompt != len(p1) || r1.ans.cached != 0 {
		t.Fatalf("cold completion: prompt_tokens %d cached_tokens %d, want %d and 0 (the prefill engine's)", r1.ans.prompt, r1.ans.cached, len(p1))
	}
	r1.pulled(t, len(p1)-0)
	r1.engineCached(t, 0, len(p1)-1)

	// 2. A streamed chat completion: the same legs, the usage event rewritten in the stream.
	r2 := pdStep(t, ctx, cl, func() pdAnswer { return pdChat(t, ctx, router, strings.Repeat("Tell me about prefix caches. ", 40)) })
	r2.check(t, pre.id, dec.id)
	if r2.ans.prompt <= 16 || r2.ans.cached != 0 {
		t.Fatalf("chat: prompt_tokens %d cached_tokens %d, want more than a block and 0 (the prefill engine's, cold)", r2.ans.prompt, r2.ans.cached)
	}
	r2.pulled(t, r2.ans.prompt)
	r2.engineCached(t, 0, r2.ans.prompt-1)

	// 3. The system prompt again with a new 100-token suffix: the prefill engine has the 512
	// tokens cached, the decode engine holds them too (it kept what it pulled in step 1) and pulls
	// only the suffix; the client hears the prefill engine's 512, the decode engine says 611.
	p3 := append(append([]uint32(nil), system...), seqIDs(100, 20000)...) // 612 tokens
	r3 := pdStep(t, ctx, cl, func() pdAnswer { return pdComplete(t, ctx, router, p3) })
	r3.check(t, pre.id, dec.id)
	if r3.ans.cached != len(system) || !(r3.ans.cached > 0 && r3.ans.cached < len(p3)-1) {
		t.Fatalf("cached completion: client's cached_tokens %d, want the prefill engine's %d (not the decode engine's %d)", r3.ans.cached, len(system), len(p3)-1)
	}
	r3.pulled(t, len(p3)-len(system))
	r3.engineCached(t, len(system), len(p3)-1)
	if ok := legs("ok"); ok != 3 {
		t.Fatalf("prefill_legs_total{outcome=ok} %v, want 3", ok)
	}

	// 4. The prefill engine stops (its agent keeps gossiping the node, as a crashed engine
	// looks): the prefill leg fails twice (a try and its retry), the decode engine prefills the
	// prompt itself, the client gets an ordinary answer.
	pre.stopEngine()
	waitRefused(t, ctx, cl, pre.engineHTTP)
	failedBefore := legs("failed")
	decBefore := scrapeSamples(t, ctx, "http://"+dec.engineHTTP+"/metrics")
	p4 := seqIDs(300, 40000)
	r4 := pdComplete(t, ctx, router, p4)
	t.Logf("after the prefill engine stopped: %+v", r4)
	if r4.status != http.StatusOK || r4.node != dec.id {
		t.Fatalf("after the prefill engine stopped: status %d node %q, want 200 from %s", r4.status, r4.node, dec.id)
	}
	if f := legs("failed"); f != failedBefore+1 {
		t.Fatalf("prefill_legs_total{outcome=failed} %v → %v, want one more", failedBefore, f)
	}
	decAfter := scrapeSamples(t, ctx, "http://"+dec.engineHTTP+"/metrics")
	if d := delta(decBefore, decAfter, `prefixmesh_simengine_legs_total{leg="whole"}`); d != 1 {
		t.Fatalf("decode engine's whole requests +%v, want +1 (it prefilled the prompt itself)", d)
	}
	if d := delta(decBefore, decAfter, `prefixmesh_simengine_prefill_tokens_total`); d != float64(len(p4)) {
		t.Fatalf("decode engine prefilled %v tokens, want the whole prompt's %d", d, len(p4))
	}
	if r4.cached != 0 {
		t.Fatalf("client's cached_tokens %d, want the decode engine's own 0", r4.cached)
	}
}

// pdAnswer is what a client saw of one request through the front door.
type pdAnswer struct {
	status                  int
	node, prefillNode       string
	prompt, cached, content int // usage's prompt and cached tokens; content: completion text bytes
}

// pdRun is one disaggregated request with both engines' metrics before and after it.
type pdRun struct {
	ans        pdAnswer
	pre0, pre1 map[string]float64
	dec0, dec1 map[string]float64
}

// pdStep scrapes both engines, sends the request and waits for the prefill engine's lease to be
// released (a decode engine pulls before it answers, so this holds at once unless it did not).
func pdStep(t *testing.T, ctx context.Context, cl *demoCluster, send func() pdAnswer) pdRun {
	t.Helper()
	pre, dec := "http://"+cl.nodes[0].engineHTTP+"/metrics", "http://"+cl.nodes[1].engineHTTP+"/metrics"
	var r pdRun
	r.pre0, r.dec0 = scrapeSamples(t, ctx, pre), scrapeSamples(t, ctx, dec)
	r.ans = send()
	t.Logf("answer: %+v", r.ans)
	var leases float64
	err := pollUntil(ctx, 10*time.Second, cl, func() bool {
		r.pre1 = scrapeSamples(t, ctx, pre)
		leases = r.pre1["prefixmesh_simengine_kv_leases"]
		return leases == 0
	})
	if err != nil {
		t.Fatalf("the prefill engine still holds %v leases: %v", leases, err)
	}
	r.dec1 = scrapeSamples(t, ctx, dec)
	return r
}

// check: the request succeeded, each leg ran where it should, and the engines saw one prefill
// leg and one decode leg that pulled from the lease (which the pull ended, not its expiry).
func (r pdRun) check(t *testing.T, prefillNode, decodeNode string) {
	t.Helper()
	if r.ans.status != http.StatusOK || r.ans.content == 0 {
		t.Fatalf("status %d, %d bytes of completion", r.ans.status, r.ans.content)
	}
	if r.ans.prefillNode != prefillNode || r.ans.node != decodeNode {
		t.Fatalf("X-Prefixmesh-Prefill-Node %q, X-Prefixmesh-Node %q: want %s then %s", r.ans.prefillNode, r.ans.node, prefillNode, decodeNode)
	}
	for _, c := range []struct {
		name   string
		before map[string]float64
		after  map[string]float64
		sample string
		want   float64
	}{
		{"prefill engine", r.pre0, r.pre1, `prefixmesh_simengine_legs_total{leg="prefill"}`, 1},
		{"prefill engine", r.pre0, r.pre1, `prefixmesh_simengine_legs_total{leg="whole"}`, 0},
		{"prefill engine", r.pre0, r.pre1, `prefixmesh_simengine_kv_leases_expired_total`, 0},
		{"decode engine", r.dec0, r.dec1, `prefixmesh_simengine_legs_total{leg="decode"}`, 1},
		{"decode engine", r.dec0, r.dec1, `prefixmesh_simengine_legs_total{leg="whole"}`, 0},
		{"decode engine", r.dec0, r.dec1, `prefixmesh_simengine_kv_pulls_total{kind="decode",outcome="ok"}`, 1},
	} {
		if d := delta(c.before, c.after, c.sample); d != c.want {
			t.Fatalf("%s: %s +%v, want +%v", c.name, c.sample, d, c.want)
		}
	}
	if d := delta(r.pre0, r.pre1, `prefixmesh_simengine_kv_served_blocks_total{kind="decode"}`); d < 1 {
		t.Fatalf("prefill engine served %v blocks to the decode engine", d)
	}
}

// pulled: the decode engine pulled want tokens (the prompt past its own hit).
func (r pdRun) pulled(t *testing.T, want int) {
	t.Helper()
	if d := delta(r.dec0, r.dec1, `prefixmesh_simengine_kv_pulled_tokens_total{kind="decode"}`); d != float64(want) {
		t.Fatalf("decode engine pulled %v tokens, want %d", d, want)
	}
}

// engineCached: what each engine counted as cached for the request, as it answered its leg.
func (r pdRun) engineCached(t *testing.T, prefill, decode int) {
	t.Helper()
	const s = `prefixmesh_simengine_cached_tokens_total`
	if d := delta(r.pre0, r.pre1, s); d != float64(prefill) {
		t.Fatalf("prefill engine's cached_tokens +%v, want %d", d, prefill)
	}
	if d := delta(r.dec0, r.dec1, s); d != float64(decode) {
		t.Fatalf("decode engine's cached_tokens +%v, want %d (vLLM's prompt − 1 after a pull)", d, decode)
	}
	if r.ans.cached != prefill {
		t.Fatalf("client's cached_tokens %d, want the prefill engine's %d", r.ans.cached, prefill)
	}
}

// pdComplete posts a 4-token completion of ids to base (the router) and reads the answer.
func pdComplete(t *testing.T, ctx context.Context, base string, ids []uint32) pdAnswer {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "prefixmesh-sim", "prompt": ids, "max_tokens": 4})
	resp := pdPost(t, ctx, base+"/v1/completions", body)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	a := pdAnswer{status: resp.StatusCode, node: resp.Header.Get("X-Prefixmesh-Node"), prefillNode: resp.Header.Get("X-Prefixmesh-Prefill-Node")}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("completion: %d %s", resp.StatusCode, b)
	}
	var out struct {
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
		Usage pdUsage `json:"usage"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("completion: %v: %s", err, b)
	}
	for _, c := range out.Choices {
		a.content += len(c.Text)
	}
	a.prompt, a.cached = out.Usage.Prompt, out.Usage.Details.Cached
	if h, err := strconv.Atoi(resp.Header.Get("X-Prefixmesh-Cached-Tokens")); err == nil && h != a.cached {
		t.Fatalf("X-Prefixmesh-Cached-Tokens %d, usage says %d", h, a.cached)
	}
	return a
}

// pdChat posts a streamed chat completion with usage in the stream and reads it to [DONE].
func pdChat(t *testing.T, ctx context.Context, base, content string) pdAnswer {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "prefixmesh-sim", "stream": true, "max_tokens": 4,
		"stream_options": map[string]any{"include_usage": true},
		"messages":       []map[string]string{{"role": "user", "content": content}}})
	resp := pdPost(t, ctx, base+"/v1/chat/completions", body)
	defer resp.Body.Close()
	a := pdAnswer{status: resp.StatusCode, node: resp.Header.Get("X-Prefixmesh-Node"), prefillNode: resp.Header.Get("X-Prefixmesh-Prefill-Node")}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("chat: %d %s: %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	done, sawUsage := false, false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			done = true
			break
		}
		var ev struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage *pdUsage `json:"usage"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatalf("chat: event %q: %v", data, err)
		}
		for _, c := range ev.Choices {
			a.content += len(c.Delta.Content)
		}
		if ev.Usage != nil {
			sawUsage = true
			a.prompt, a.cached = ev.Usage.Prompt, ev.Usage.Details.Cached
		}
	}
	if err := sc.Err(); err != nil || !done || !sawUsage {
		t.Fatalf("chat stream: err %v, [DONE] %v, usage %v", err, done, sawUsage)
	}
	return a
}

type pdUsage struct {
	Prompt  int `json:"prompt_tokens"`
	Details struct {
		Cached int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

func pdPost(t *testing.T, ctx context.Context, url string, body []byte) *http.Response {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// scrapeSamples reads a Prometheus text page into sample (name with its labels, as exposed) →
// value.
func scrapeSamples(t *testing.T, ctx context.Context, url string) map[string]float64 {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	out := map[string]float64{}
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out
}

// delta is a sample's growth between two scrapes (absent counts as 0: a labelled counter exists
// from its first increment).
func delta(before, after map[string]float64, sample string) float64 {
	return after[sample] - before[sample]
}

// waitRefused waits until nothing listens at addr any more (a stopped daemon's listener closes).
func waitRefused(t *testing.T, ctx context.Context, cl *demoCluster, addr string) {
	t.Helper()
	err := pollUntil(ctx, 30*time.Second, cl, func() bool {
		c, err := (&net.Dialer{Timeout: time.Second}).DialContext(ctx, "tcp", addr)
		if err == nil {
			c.Close()
			return false
		}
		return !errors.Is(err, context.DeadlineExceeded)
	})
	if err != nil {
		t.Fatalf("%s still listens: %v", addr, err)
	}
}
