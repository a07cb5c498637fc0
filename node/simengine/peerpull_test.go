package simengine

import (
	"encoding/json"
	"net"
	"slices"
	"strconv"
	"testing"

	"github.com/prefixmesh/prefixmesh/local"
)

// sourceParams is llm-d's remote_kv_source naming te's side channel
// (llm-d/llm-d-router pkg/sidecar/proxy/connector_p2p.go p2pSourceParams: kv_request_id, a uuid;
// remote_host; remote_port, an int).
func sourceParams(t *testing.T, te *pdEngine) map[string]any {
	t.Helper()
	host, port, err := net.SplitHostPort(te.KVSideChannelAddr())
	if err != nil {
		t.Fatal(err)
	}
	p, _ := strconv.Atoi(port)
	return map[string]any{"remote_kv_source": map[string]any{"kv_request_id": "6f1c7b8e-0d5a-4c1e-9d7f-1b2a3c4d5e6f",
		"remote_host": host, "remote_port": p}}
}

// A request carrying remote_kv_source pulls, of the prompt's full blocks past its own hit, the
// run the peer holds, counts them as cached as llm-d's P2P tier loads them as ordinary hits, and
// prefills the rest; the pulled blocks are its own afterwards. With the peer gone it computes
// the prompt itself.
func TestPeerPull(t *testing.T) {
	const rate = 1e6
	acfg := fastConfig()
	acfg.EngineID = "peer-a"
	a := startPD(t, acfg, nil)
	bcfg := fastConfig()
	bcfg.KVTransferTokensPerSec = rate
	b := startPD(t, bcfg, nil)

	x := tokenPrompt(100, 1000) // the peer will hold its 6 full blocks
	if resp, body := a.post(t, "/v1/completions", map[string]any{"prompt": x, "max_tokens": 1}); resp.StatusCode != 200 {
		t.Fatalf("warm the peer: %d %s", resp.StatusCode, body)
	}
	if resp, body := b.post(t, "/v1/completions", map[string]any{"prompt": x[:40], "max_tokens": 1}); resp.StatusCode != 200 {
		t.Fatalf("warm b: %d %s", resp.StatusCode, body) // b holds 2 full blocks of x itself
	}
	prompt := append(append([]uint32(nil), x...), tokenPrompt(40, 7000)...) // 140 tokens
	resp, body := b.post(t, "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 2, "kv_transfer_params": sourceParams(t, a)})
	r := decodeResponse(t, body)
	if resp.StatusCode != 200 || r.Usage.PromptTokensDetails.CachedTokens != 96 || r.KVTransferParams != nil {
		t.Fatalf("peer pull: %d %s, want 96 cached (32 local + 64 pulled)", resp.StatusCode, body)
	}
	for name, want := range map[string]float64{
		"prefixmesh_simengine_kv_pulled_tokens_total":    64, // blocks 2..5: the peer's past b's own two
		"prefixmesh_simengine_prefill_tokens_total":      40 + 44,
		"prefixmesh_simengine_kv_transfer_seconds_total": 64 / rate,
	} {
		if got := metricValue(t, b.testEngine, name, nil); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if got := pullCount(t, b, pullPeer, outcomeOK); got != 1 {
		t.Errorf("peer pulls ok = %v, want 1", got)
	}
	if got := metricValue(t, a.testEngine, "prefixmesh_simengine_kv_served_blocks_total", map[string]string{"kind": pullPeer}); got != 4 {
		t.Errorf("the peer served %v blocks, want 4", got)
	}
	// The pulled blocks are b's own now: the same prompt again is a local hit.
	resp, body = b.post(t, "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1})
	if r := decodeResponse(t, body); resp.StatusCode != 200 || r.Usage.PromptTokensDetails.CachedTokens != 128 {
		t.Fatalf("repeat on b: %d %s, want 128 cached", resp.StatusCode, body)
	}
	if got, want := b.legs.all(), []string{legWhole, legWhole, legWhole}; !slices.Equal(got, want) {
		t.Errorf("b's legs %v, want %v", got, want)
	}

	// The peer goes away: b computes the prompt itself.
	src := sourceParams(t, a)
	a.Close()
	y := tokenPrompt(100, 20000)
	resp, body = b.post(t, "/v1/completions", map[string]any{"prompt": y, "max_tokens": 1, "kv_transfer_params": src})
	if r := decodeResponse(t, body); resp.StatusCode != 200 || r.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("peer gone: %d %s, want 200 with nothing cached", resp.StatusCode, body)
	}
	if got := pullCount(t, b, pullPeer, outcomeRecompute); got != 1 {
		t.Errorf("peer pulls recomputed = %v, want 1", got)
	}
	if got := metricValue(t, b.testEngine, "prefixmesh_simengine_kv_pulled_tokens_total", nil); got != 64 {
		t.Errorf("pulled %v tokens in all, want still 64", got)
	}
	b.checkNoLeases(t)
	a.checkNoLeases(t)
}

// A peer answers from its CPU tier too: blocks its GPU evicted spilled there, and it serves
// them (tier "CPU") as the run continuing its GPU prefix.
func TestPeerPullFromCPUTier(t *testing.T) {
	acfg := fastConfig()
	acfg.KVBlocks = 8 // one 7-block prompt at a time
	acfg.CPUBlocks = 64
	a := startPD(t, acfg, nil)
	b := startPD(t, fastConfig(), nil)
	x := tokenPrompt(100, 1000)
	for _, p := range [][]uint32{x, tokenPrompt(100, 5000)} { // the second evicts most of x into the CPU tier
		if resp, body := a.post(t, "/v1/completions", map[string]any{"prompt": p, "max_tokens": 1}); resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
	}
	a.mu.Lock()
	gpu, cpu := a.peekTiersLocked(x, 0)
	a.mu.Unlock()
	if gpu != 16 || cpu != 80 {
		t.Fatalf("the peer holds x as %d GPU + %d CPU tokens, want 16 + 80 (the second prompt evicted 5 blocks)", gpu, cpu)
	}
	got, err := a.lookupBlocks(lookupRequest{Version: sideChannelVersion, BlockSize: 16, Tokens: x[:96],
		Hashes: local.BlockHashes(x[:96], 16, 0)})
	if err != nil || len(got.Blocks) != 6 {
		t.Fatalf("lookup %+v, %v: want 6 blocks", got, err)
	}
	for i, blk := range got.Blocks {
		if want := map[bool]string{true: "GPU", false: "CPU"}[i == 0]; blk.Tier != want || blk.Position != i {
			t.Fatalf("block %d: %+v, want position %d from the %s", i, blk, i, want)
		}
	}
	resp, body := b.post(t, "/v1/completions", map[string]any{"prompt": x, "max_tokens": 1, "kv_transfer_params": sourceParams(t, a)})
	if r := decodeResponse(t, body); resp.StatusCode != 200 || r.Usage.PromptTokensDetails.CachedTokens != 96 {
		t.Fatalf("pull from the CPU tier: %d %s", resp.StatusCode, body)
	}
	// A peer with another hash seed (here: another adapter's) refuses rather than serve.
	bad := lookupRequest{Version: sideChannelVersion, BlockSize: 16, Tokens: x[:96], Hashes: local.BlockHashes(x[:96], 16, 3)}
	if _, err := a.lookupBlocks(bad); err == nil {
		t.Fatal("lookup with foreign hashes served")
	}
	raw, _ := json.Marshal(bad)
	if resp, _ := a.post(t, "/v1/completions", raw); resp.StatusCode == 200 {
		t.Fatal("the OpenAI listener accepted a side-channel body") // the side channel has its own listener
	}
	a.checkNoLeases(t)
	b.checkNoLeases(t)
}

// A decode leg whose pull would move fewer tokens than kv_recompute_threshold recomputes them
// (nixl/pull_scheduler.py _should_recompute_remote_kv) and frees the prefill engine's lease.
func TestRecomputeThreshold(t *testing.T) {
	p := startPD(t, fastConfig(), nil)
	dcfg := fastConfig()
	dcfg.KVRecomputeThreshold = 64
	d := startPD(t, dcfg, nil)
	client := map[string]any{"prompt": tokenPrompt(100, 1000), "max_tokens": 1}
	if resp, body := d.post(t, "/v1/completions", client); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body) // d holds 96 of the 100 tokens
	}
	params, _ := prefillLeg(t, p, client)
	code, r, b := decodeLeg(t, d, client, params)
	if code != 200 || r.Usage.PromptTokensDetails.CachedTokens != 96 {
		t.Fatalf("under the threshold: %d %s, want the local 96 cached and the rest computed", code, b)
	}
	if got := pullCount(t, d, pullDecode, outcomeRecompute); got != 1 {
		t.Fatalf("recomputed pulls = %v, want 1", got)
	}
	p.checkReleased(t) // told at once, not left to expire

	// Over the threshold it pulls.
	client2 := map[string]any{"prompt": tokenPrompt(100, 3000), "max_tokens": 1}
	params2, _ := prefillLeg(t, p, client2)
	if code, r, b := decodeLeg(t, d, client2, params2); code != 200 || r.Usage.PromptTokensDetails.CachedTokens != 99 {
		t.Fatalf("over the threshold: %d %s", code, b)
	}
	p.checkNoLeases(t)
	d.checkNoLeases(t)
}
