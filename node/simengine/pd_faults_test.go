package simengine

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// pullCount is the decode engine's kv_pulls_total for one kind and outcome.
func pullCount(t *testing.T, te *pdEngine, kind, outcome string) float64 {
	t.Helper()
	return metricValue(t, te.testEngine, "prefixmesh_simengine_kv_pulls_total", map[string]string{"kind": kind, "outcome": outcome})
}

// decodeLeg posts a decode leg and returns its status and body.
func decodeLeg(t *testing.T, d *pdEngine, client map[string]any, params json.RawMessage) (int, response, []byte) {
	t.Helper()
	resp, b := d.post(t, "/v1/completions", toyDecode(client, params))
	var r response
	if resp.StatusCode == 200 {
		r = decodeResponse(t, b)
	}
	return resp.StatusCode, r, b
}

// The prefill engine stops between the legs: its lease goes with it (no leaked blocks), and the
// decode leg's pull fails, which kv_load_failure_policy turns into a local prefill (recompute,
// vLLM's default) or a 500 (fail).
func TestDecodeAfterPrefillEngineStopped(t *testing.T) {
	for _, policy := range []string{PolicyRecompute, PolicyFail} {
		t.Run(policy, func(t *testing.T) {
			p := startPD(t, fastConfig(), nil)
			dcfg := fastConfig()
			dcfg.KVLoadFailurePolicy = policy
			d := startPD(t, dcfg, nil)
			client := map[string]any{"prompt": tokenPrompt(100, 1000), "max_tokens": 2}
			params, _ := prefillLeg(t, p, client)
			p.Close()
			p.checkNoLeases(t)

			code, r, b := decodeLeg(t, d, client, params)
			switch policy {
			case PolicyRecompute:
				if code != 200 || r.Usage.PromptTokensDetails.CachedTokens != 0 {
					t.Fatalf("recompute: %d %s, want 200 with nothing cached", code, b)
				}
				if got := metricValue(t, d.testEngine, "prefixmesh_simengine_prefill_tokens_total", nil); got != 100 {
					t.Fatalf("decode engine prefilled %v tokens, want all 100", got)
				}
			case PolicyFail:
				if code != http.StatusInternalServerError || !strings.Contains(string(b), "kv_load_failed") {
					t.Fatalf("fail: %d %s, want a 500 kv_load_failed", code, b)
				}
			}
			if got := pullCount(t, d, pullDecode, map[string]string{PolicyRecompute: outcomeRecompute, PolicyFail: outcomeFail}[policy]); got != 1 {
				t.Fatalf("pulls with outcome for %s = %v, want 1", policy, got)
			}
			if got := metricValue(t, d.testEngine, "prefixmesh_simengine_kv_pulled_tokens_total", nil); got != 0 {
				t.Fatalf("pulled %v tokens from a stopped engine", got)
			}
			d.checkNoLeases(t)
		})
	}
}

// A lease expires when no decode engine pulls in time: the expiry loop frees the blocks on its
// own (the lease clock moved past kv_lease_duration), and a pull that arrives after the deadline
// frees them itself and is refused. Either way the decode leg follows its policy and the prefill
// engine's pool comes back to its baseline.
func TestLeaseExpires(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	pcfg := fastConfig()
	pcfg.KVLeaseDuration = 30 * time.Second
	p := startPD(t, pcfg, clk)
	d := startPD(t, fastConfig(), nil)
	dcfg := fastConfig()
	dcfg.KVLoadFailurePolicy = PolicyFail
	dFail := startPD(t, dcfg, nil)

	// The expiry loop.
	client := map[string]any{"prompt": tokenPrompt(100, 1000), "max_tokens": 2}
	params, _ := prefillLeg(t, p, client)
	if p.Leases() != 1 {
		t.Fatalf("%d leases after a prefill leg", p.Leases())
	}
	clk.Advance(30*time.Second - time.Nanosecond)
	p.kick()
	clk.Advance(time.Nanosecond) // exactly kv_lease_duration after the lease began
	p.kick()
	eventually(t, "the lease to expire", func() bool { return p.Leases() == 0 })
	if got := metricValue(t, p.testEngine, "prefixmesh_simengine_kv_leases_expired_total", nil); got != 1 {
		t.Fatalf("leases expired = %v, want 1", got)
	}
	p.checkReleased(t)
	if code, r, b := decodeLeg(t, d, client, params); code != 200 || r.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("decode after expiry: %d %s, want a local prefill", code, b)
	}
	if got := pullCount(t, d, pullDecode, outcomeRecompute); got != 1 {
		t.Fatalf("recomputed pulls = %v, want 1", got)
	}

	// A pull after the deadline, before the loop noticed.
	client2 := map[string]any{"prompt": tokenPrompt(100, 3000), "max_tokens": 2}
	params2, _ := prefillLeg(t, p, client2)
	clk.Advance(31 * time.Second)
	if code, _, b := decodeLeg(t, dFail, client2, params2); code != http.StatusInternalServerError {
		t.Fatalf("decode after expiry under fail: %d %s, want 500", code, b)
	}
	if got := metricValue(t, p.testEngine, "prefixmesh_simengine_kv_leases_expired_total", nil); got != 2 {
		t.Fatalf("leases expired = %v, want 2", got)
	}
	if got := pullCount(t, dFail, pullDecode, outcomeFail); got != 1 {
		t.Fatalf("failed pulls = %v, want 1", got)
	}
	p.checkNoLeases(t)
	d.checkNoLeases(t)
	dFail.checkNoLeases(t)
}

// Params that fail vLLM's test (remote_block_ids empty, an address key missing) are logged and
// the prompt computed locally whatever the policy: vLLM never tries the transfer. Params that
// pass it but cannot be used (a port that is no number, a null host) fail at load time, so the
// policy decides. The prefill engine's lease is left alone and expires.
func TestInvalidKVTransferParams(t *testing.T) {
	p := startPD(t, fastConfig(), nil)
	dcfg := fastConfig()
	dcfg.KVLoadFailurePolicy = PolicyFail
	d := startPD(t, dcfg, nil)
	client := map[string]any{"prompt": tokenPrompt(100, 1000), "max_tokens": 2}
	raw, _ := prefillLeg(t, p, client)
	var good map[string]any
	if err := json.Unmarshal(raw, &good); err != nil {
		t.Fatal(err)
	}
	edit := func(f func(m map[string]any)) json.RawMessage {
		m := map[string]any{}
		for k, v := range good {
			m[k] = v
		}
		f(m)
		b, _ := json.Marshal(m)
		return b
	}
	for _, c := range []struct {
		name   string
		params json.RawMessage
		code   int
	}{
		{"empty remote_block_ids", edit(func(m map[string]any) { m["remote_block_ids"] = []any{} }), 200},
		{"null remote_block_ids", edit(func(m map[string]any) { m["remote_block_ids"] = nil }), 200},
		{"no remote_host", edit(func(m map[string]any) { delete(m, "remote_host") }), 200},
		{"no remote_request_id", edit(func(m map[string]any) { delete(m, "remote_request_id") }), 200},
		{"no remote_engine_id", edit(func(m map[string]any) { delete(m, "remote_engine_id") }), 200},
		{"no remote_port", edit(func(m map[string]any) { delete(m, "remote_port") }), 200},
		{"remote_port a string", edit(func(m map[string]any) { m["remote_port"] = "x" }), 500},
		{"null remote_host", edit(func(m map[string]any) { m["remote_host"] = nil }), 500},
		{"another engine id", edit(func(m map[string]any) { m["remote_engine_id"] = "someone-else" }), 500},
	} {
		// The first local prefill caches the prompt's full blocks; later ones hit them.
		code, r, b := decodeLeg(t, d, client, c.params)
		if code != c.code || code == 200 && r.Usage.PromptTokensDetails.CachedTokens == 99 {
			t.Errorf("%s: %d %s, want %d computed locally", c.name, code, b, c.code)
		}
	}
	if got := metricValue(t, d.testEngine, "prefixmesh_simengine_kv_pulled_tokens_total", nil); got != 0 {
		t.Errorf("invalid and unusable params pulled %v tokens", got)
	}
	if got := pullCount(t, d, pullDecode, outcomeRecompute); got != 6 {
		t.Errorf("invalid params recomputed %v times, want 6", got)
	}
	if got := pullCount(t, d, pullDecode, outcomeFail); got != 3 {
		t.Errorf("unusable params failed %v times, want 3", got)
	}
	if p.Leases() != 1 {
		t.Fatalf("the prefill engine holds %d leases, want its one lease untouched", p.Leases())
	}
	// The good params still pull: the 4 tokens past the 96 the decode engine now holds.
	if code, r, b := decodeLeg(t, d, client, raw); code != 200 || r.Usage.PromptTokensDetails.CachedTokens != 99 {
		t.Fatalf("valid params: %d %s", code, b)
	}
	if got := metricValue(t, d.testEngine, "prefixmesh_simengine_kv_pulled_tokens_total", nil); got != 4 {
		t.Errorf("pulled %v tokens, want the 4 of the partial last block", got)
	}
	p.checkNoLeases(t)
	d.checkNoLeases(t)
}

// The decode leg fails after the prefill leg leased its blocks: the decode engine cannot admit
// it (the prompt needs more blocks than its pool has), or its client leaves while it waits for a
// slot. Either way the decode engine tells the prefill engine it will not read, as vLLM's decode
// frees the remote blocks of a request aborted before it was scheduled, and the prefill engine's
// pool comes back to its baseline at once.
func TestDecodeFailsAfterPrefill(t *testing.T) {
	p := startPD(t, fastConfig(), nil)
	small := fastConfig()
	small.KVBlocks = 4 // 64 tokens
	dSmall := startPD(t, small, nil)
	client := map[string]any{"prompt": tokenPrompt(100, 1000), "max_tokens": 2}
	params, _ := prefillLeg(t, p, client)
	if code, _, b := decodeLeg(t, dSmall, client, params); code != http.StatusBadRequest {
		t.Fatalf("too large for the decode pool: %d %s", code, b)
	}
	p.checkReleased(t)

	busy := fastConfig()
	busy.MaxConcurrent = 1
	busy.DecodeTokensPerSec = 1 // the blocker decodes for minutes unless cancelled
	d := startPD(t, busy, nil)
	blockCtx, unblock := context.WithCancel(t.Context())
	defer unblock()
	blocker := d.openStream(t, blockCtx, "/v1/completions", map[string]any{"prompt": tokenPrompt(10, 1), "max_tokens": 1000, "stream": true})
	defer blocker.Body.Close()
	eventually(t, "the blocker to run", func() bool { return d.Load().Running == 1 })

	params2, _ := prefillLeg(t, p, map[string]any{"prompt": tokenPrompt(100, 4000), "max_tokens": 2})
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		body, _ := json.Marshal(toyDecode(map[string]any{"prompt": tokenPrompt(100, 4000), "max_tokens": 2}, params2))
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, d.srv.URL+"/v1/completions", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	eventually(t, "the decode leg to queue", func() bool { return d.Load().Waiting == 1 })
	cancel()
	wg.Wait()
	p.checkReleased(t)
	unblock()
	p.checkNoLeases(t)
	d.checkNoLeases(t)
	dSmall.checkNoLeases(t)
}

// A prefill leg cut short (its client leaves mid-prefill) returns no params and keeps nothing.
func TestAbortedPrefillLegFreesBlocks(t *testing.T) {
	cfg := fastConfig()
	cfg.PrefillTokensPerSec = 1 // 100 tokens take 100 s unless cancelled
	p := startPD(t, cfg, nil)
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		body, _ := json.Marshal(toyPrefill(map[string]any{"prompt": tokenPrompt(100, 1000), "max_tokens": 2}))
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, p.srv.URL+"/v1/completions", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	eventually(t, "the prefill leg to run", func() bool { return p.Load().Running == 1 })
	cancel()
	wg.Wait()
	p.checkNoLeases(t)
}

// A decode leg waiting for a slot renews the prefill engine's lease every kv_lease_duration/6
// (vLLM's heartbeat), so the blocks outlive their first deadline and the pull succeeds.
func TestHeartbeatKeepsLease(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	pcfg := fastConfig()
	pcfg.KVLeaseDuration = 30 * time.Second
	p := startPD(t, pcfg, clk)
	dcfg := fastConfig()
	dcfg.MaxConcurrent = 1
	dcfg.DecodeTokensPerSec = 1
	dcfg.KVLeaseDuration = 60 * time.Millisecond // heartbeats every 10 ms of real time
	d := startPD(t, dcfg, nil)
	blockCtx, unblock := context.WithCancel(t.Context())
	defer unblock()
	blocker := d.openStream(t, blockCtx, "/v1/completions", map[string]any{"prompt": tokenPrompt(10, 1), "max_tokens": 1000, "stream": true})
	defer blocker.Body.Close()
	eventually(t, "the blocker to run", func() bool { return d.Load().Running == 1 })

	client := map[string]any{"prompt": tokenPrompt(100, 1000), "max_tokens": 1}
	params, _ := prefillLeg(t, p, client)
	var out kvTransferOut
	_ = json.Unmarshal(params, &out)
	expiry := func() time.Time {
		p.mu.Lock()
		defer p.mu.Unlock()
		if l := p.leases[out.RemoteRequestID]; l != nil {
			return l.expires
		}
		return time.Time{}
	}
	first := expiry()
	type result struct {
		code int
		r    response
	}
	done := make(chan result, 1)
	go func() {
		body, _ := json.Marshal(toyDecode(client, params))
		resp, err := http.Post(d.srv.URL+"/v1/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			done <- result{}
			return
		}
		defer resp.Body.Close()
		var r response
		_ = json.NewDecoder(resp.Body).Decode(&r)
		done <- result{resp.StatusCode, r}
	}()
	eventually(t, "the decode leg to queue", func() bool { return d.Load().Waiting == 1 })
	clk.Advance(20 * time.Second)
	eventually(t, "a heartbeat to renew the lease", func() bool { return expiry().After(first) })
	clk.Advance(20 * time.Second) // 40 s after the prefill: past the first deadline
	p.kick()
	unblock()
	var res result
	select {
	case res = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the decode leg did not finish")
	}
	if res.code != 200 || res.r.Usage == nil || res.r.Usage.PromptTokensDetails.CachedTokens != 99 {
		t.Fatalf("decode leg after renewal: %d %+v, want a successful pull", res.code, res.r.Usage)
	}
	if got := pullCount(t, d, pullDecode, outcomeOK); got != 1 {
		t.Fatalf("pulls ok = %v, want 1", got)
	}
	if got := metricValue(t, p.testEngine, "prefixmesh_simengine_kv_leases_expired_total", nil); got != 0 {
		t.Fatalf("leases expired = %v, want 0", got)
	}
	p.checkNoLeases(t)
	d.checkNoLeases(t)
}
