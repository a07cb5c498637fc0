package simengine

import (
	"encoding/json"
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
	"testing"
)

// vllmPrefillParams are the keys, and their JSON types, of the kv_transfer_params a prefill
// engine returns: the dict NixlConnector's request_finished builds on a P node
// (vllm-project/vllm vllm/distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py
// @0050936): do_remote_prefill=is_p_node, do_remote_decode=is_d_node,
// remote_block_ids=block_ids (BlockIds = tuple[list[int], ...], one list per KV-cache group:
// vllm/distributed/kv_transfer/kv_connector/utils.py), remote_engine_id=self.engine_id,
// remote_request_id=request.request_id, remote_host/remote_port = the side channel's host (str)
// and port (int), tp_size, dcp_size, pp_size (ints), remote_num_tokens=num_computed_tokens,
// remote_blocks_expiry_time (None unless is_d_node), transfer_mode=_TRANSFER_MODE ("pull",
// nixl/base_scheduler.py).
var vllmPrefillParams = map[string]string{
	"do_remote_prefill": "bool", "do_remote_decode": "bool", "remote_block_ids": "int lists",
	"remote_engine_id": "string", "remote_request_id": "string", "remote_host": "string",
	"remote_port": "int", "tp_size": "int", "dcp_size": "int", "pp_size": "int",
	"remote_num_tokens": "int", "remote_blocks_expiry_time": "null", "transfer_mode": "string",
}

// jsonKind names a JSON value's type as vllmPrefillParams does.
func jsonKind(raw json.RawMessage) string {
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return "invalid"
	}
	switch x := v.(type) {
	case nil:
		return "null"
	case bool:
		return "bool"
	case string:
		return "string"
	case float64:
		if x == math.Trunc(x) {
			return "int"
		}
		return "float"
	case []any:
		for _, g := range x {
			inner, ok := g.([]any)
			if !ok {
				return "list"
			}
			for _, n := range inner {
				if f, ok := n.(float64); !ok || f != math.Trunc(f) || f < 0 {
					return "list"
				}
			}
		}
		return "int lists"
	}
	return "object"
}

// Two engines on loopback, driven as vLLM's toy proxy drives a prefill and a decode engine: the
// prefill leg answers vLLM's kv_transfer_params naming its real, leased pool blocks; the decode
// leg pulls exactly the blocks it lacks, inserts them (its KV events show them as GPU stores)
// and reports cached_tokens = prompt − 1 as vLLM does; the lease ends with the pull and the
// prefill engine's pool comes back to its baseline. A second turn of the same conversation
// pulls only what the decode engine does not already hold.
func TestPrefillDecodeLegs(t *testing.T) {
	const bs, rate = 16, 1e6
	pcfg := fastConfig()
	pcfg.EngineID = "prefill-0"
	pcfg.KVTransferTokensPerSec = rate
	p := startPD(t, pcfg, nil)
	dcfg := fastConfig()
	dcfg.EngineID = "decode-0"
	dcfg.KVTransferTokensPerSec = rate
	dcfg.KVEvents.Endpoint, dcfg.KVEvents.Replay = "tcp://127.0.0.1:0", "tcp://127.0.0.1:0"
	d := startPD(t, dcfg, nil)
	mir := follow(t, d, bs)

	turn1 := tokenPrompt(100, 1000) // 6 full blocks and 4 tokens
	client := map[string]any{"prompt": turn1, "max_tokens": 3, "stream": true,
		"stream_options": map[string]any{"include_usage": true}, "min_tokens": 1}

	params, top := prefillLeg(t, p, client)
	var choices []struct {
		FinishReason string `json:"finish_reason"`
	}
	var usage1 usage
	_ = json.Unmarshal(top["choices"], &choices)
	_ = json.Unmarshal(top["usage"], &usage1)
	if len(choices) != 1 || choices[0].FinishReason != "length" || usage1.CompletionTokens != 1 {
		t.Fatalf("prefill leg: choices %+v usage %+v, want one token finished by length", choices, usage1)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(params, &fields); err != nil {
		t.Fatalf("kv_transfer_params %s: %v", params, err)
	}
	for k, want := range vllmPrefillParams {
		if got := jsonKind(fields[k]); fields[k] == nil || got != want {
			t.Errorf("kv_transfer_params.%s = %s (%s), want a %s", k, fields[k], got, want)
		}
	}
	for k := range fields {
		if _, ok := vllmPrefillParams[k]; !ok {
			t.Errorf("kv_transfer_params.%s: not a key vLLM's request_finished returns", k)
		}
	}
	var out kvTransferOut
	if err := json.Unmarshal(params, &out); err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(p.KVSideChannelAddr())
	if !out.DoRemotePrefill || out.DoRemoteDecode || out.RemoteEngineID != "prefill-0" || out.RemoteHost != host ||
		strconv.Itoa(out.RemotePort) != port || out.TPSize != 1 || out.RemoteNumTokens != 100 || out.TransferMode != "pull" {
		t.Fatalf("kv_transfer_params %+v (side channel %s)", out, p.KVSideChannelAddr())
	}
	// The ids are the prefill engine's real blocks, held by the lease: all 7 of the prompt's.
	p.mu.Lock()
	l := p.leases[out.RemoteRequestID]
	p.mu.Unlock()
	if l == nil || len(out.RemoteBlockIDs) != 1 || !slices.Equal(out.RemoteBlockIDs[0], l.blocks) || len(l.blocks) != 7 {
		t.Fatalf("remote_block_ids %v, lease %+v", out.RemoteBlockIDs, l)
	}
	if st := p.PoolStats(); st.Blocks-st.Free != 7 || p.Load().Running != 0 {
		t.Fatalf("prefill pool %+v, load %+v: want exactly the 7 leased blocks held and nothing running", st, p.Load())
	}
	if got := metricValue(t, p.testEngine, "prefixmesh_simengine_kv_leases", nil); got != 1 {
		t.Fatalf("kv_leases = %v, want 1", got)
	}

	s := d.streamAll(t, "/v1/completions", toyDecode(client, params))
	u := s.chunks[len(s.chunks)-1].Usage
	if u == nil || u.PromptTokens != 100 || u.CompletionTokens != 3 || u.PromptTokensDetails.CachedTokens != 99 {
		t.Fatalf("decode usage %+v, want 100 prompt tokens, 3 completion, 99 cached (vLLM counts pulled tokens as cached)", u)
	}
	if got := s.header.Get(HeaderCachedTokens); got != "99" {
		t.Fatalf("decode %s = %q, want 99", HeaderCachedTokens, got)
	}
	for name, want := range map[string]float64{
		"prefixmesh_simengine_kv_pulled_tokens_total":    100, // the whole prompt: the decode engine had nothing
		"prefixmesh_simengine_prefill_tokens_total":      1,   // the last prompt token, recomputed
		"prefixmesh_simengine_kv_transfer_seconds_total": 100 / rate,
	} {
		if got := metricValue(t, d.testEngine, name, map[string]string{"kind": pullDecode}); math.Abs(got-want) > 1e-12 {
			t.Errorf("decode %s = %v, want %v", name, got, want)
		}
	}
	if got := metricValue(t, d.testEngine, "prefixmesh_simengine_kv_pulls_total", map[string]string{"kind": pullDecode, "outcome": outcomeOK}); got != 1 {
		t.Errorf("decode pulls ok = %v, want 1", got)
	}
	if got := metricValue(t, p.testEngine, "prefixmesh_simengine_kv_served_blocks_total", map[string]string{"kind": pullDecode}); got != 7 {
		t.Errorf("prefill served %v blocks, want 7", got)
	}
	p.checkReleased(t) // the pull ended the lease
	// The pulled blocks are the decode engine's own now, and its KV events say so.
	if got := d.cache.PeekMatchedTokens(turn1, bs, 0); got != 96 {
		t.Fatalf("decode cache holds %d tokens of the prompt, want its 96 full-block tokens", got)
	}
	eventually(t, "the decode engine's KV events to show the pulled blocks", func() bool {
		return mir.PeekMatchedTokens(turn1, bs, 0) == 96
	})

	// Turn 2: the conversation grows by 60 tokens. The prefill engine reuses its cached prefix;
	// the decode engine holds the first turn's 6 full blocks and pulls from block 6 on.
	turn2 := append(append([]uint32(nil), turn1...), tokenPrompt(60, 5000)...)
	client2 := map[string]any{"prompt": turn2, "max_tokens": 2}
	params2, top2 := prefillLeg(t, p, client2)
	var u2 usage
	_ = json.Unmarshal(top2["usage"], &u2)
	if u2.PromptTokensDetails.CachedTokens != 96 {
		t.Fatalf("turn 2 prefill cached %d, want 96", u2.PromptTokensDetails.CachedTokens)
	}
	resp, b := d.post(t, "/v1/completions", toyDecode(client2, params2))
	if r := decodeResponse(t, b); resp.StatusCode != 200 || r.Usage.PromptTokensDetails.CachedTokens != 159 || r.KVTransferParams != nil {
		t.Fatalf("turn 2 decode: %d %s", resp.StatusCode, b)
	}
	if got := metricValue(t, d.testEngine, "prefixmesh_simengine_kv_pulled_tokens_total", nil); got != 100+(160-96) {
		t.Fatalf("pulled tokens after turn 2 = %v, want 100 + 64: only the blocks past the first turn's", got)
	}
	if got := metricValue(t, p.testEngine, "prefixmesh_simengine_kv_served_blocks_total", nil); got != 7+4 {
		t.Fatalf("prefill served %v blocks in all, want 7 + 4 (blocks 6..9 of turn 2)", got)
	}
	// A whole request beside them, and the legs as each engine logged them.
	if resp, b := d.post(t, "/v1/completions", map[string]any{"prompt": tokenPrompt(20, 9000), "max_tokens": 1}); resp.StatusCode != 200 {
		t.Fatalf("whole request: %d %s", resp.StatusCode, b)
	}
	if got, want := p.legs.all(), []string{legPrefill, legPrefill}; !slices.Equal(got, want) {
		t.Errorf("prefill engine's legs %v, want %v", got, want)
	}
	if got, want := d.legs.all(), []string{legDecode, legDecode, legWhole}; !slices.Equal(got, want) {
		t.Errorf("decode engine's legs %v, want %v", got, want)
	}
	for leg, want := range map[string]float64{legPrefill: 2, legDecode: 0} {
		if got := metricValue(t, p.testEngine, "prefixmesh_simengine_legs_total", map[string]string{"leg": leg}); got != want {
			t.Errorf("prefill engine legs_total{%s} = %v, want %v", leg, got, want)
		}
	}
	eventually(t, "the decode engine's KV events to show turn 2", func() bool {
		return mir.PeekMatchedTokens(turn2, bs, 0) == 160
	})
	p.checkNoLeases(t)
	d.checkNoLeases(t)
}

// Chat works the same way; the params ride on the chat response too.
func TestPrefillDecodeChat(t *testing.T) {
	p := startPD(t, fastConfig(), nil)
	d := startPD(t, fastConfig(), nil)
	client := map[string]any{"messages": []map[string]any{{"role": "user", "content": fmt.Sprintf("%0200d", 7)}}, "max_tokens": 2}
	params, _ := prefillLeg(t, p, client)
	resp, b := d.post(t, "/v1/chat/completions", toyDecode(client, params))
	r := decodeResponse(t, b)
	if resp.StatusCode != 200 || r.Usage.PromptTokensDetails.CachedTokens != r.Usage.PromptTokens-1 {
		t.Fatalf("chat decode leg: %d %s", resp.StatusCode, b)
	}
	p.checkNoLeases(t)
	d.checkNoLeases(t)
}
