package simengine

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/prefixmesh/prefixmesh/local"
)

// kv_transfer_params as vLLM reads them. Expectations follow vLLM's source, not this code:
// NixlConnector's get_num_new_matched_tokens and update_state_after_alloc
// (vllm/distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py) test the flags with
// params.get(...) (Python truthiness) and pull only when params.get("remote_block_ids") is truthy
// and remote_engine_id, remote_request_id, remote_host and remote_port are all keys of params;
// remote_block_ids is one list per KV-cache group (kv_connector/utils.py BlockIds). llm-d's
// remote_kv_source is {kv_request_id, remote_host, remote_port}
// (llm-d/llm-d-router pkg/sidecar/proxy/connector_p2p.go p2pSourceParams).
func TestKVParamsOf(t *testing.T) {
	const addr = `"remote_engine_id":"p0","remote_request_id":"r1","remote_host":"10.0.0.7","remote_port":5600`
	for _, c := range []struct {
		name    string
		params  string
		leg     string
		pulls   bool     // passes vLLM's test
		bad     bool     // passes it, but a value cannot be used
		ids     []uint32 // block ids of the one group
		source  bool
		invalid string // substring of the reason
	}{
		{name: "toy proxy prefill", params: `{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`, leg: legPrefill},
		{name: "decode", params: `{"do_remote_prefill":true,"remote_block_ids":[[3,4,5]],` + addr + `}`, leg: legDecode, pulls: true, ids: []uint32{3, 4, 5}},
		{name: "flag truthy as 1", params: `{"do_remote_prefill":1,"remote_block_ids":[[3]],` + addr + `}`, leg: legDecode, pulls: true, ids: []uint32{3}},
		{name: "flag truthy as a non-empty string", params: `{"do_remote_prefill":"false","remote_block_ids":[[3]],` + addr + `}`, leg: legDecode, pulls: true, ids: []uint32{3}},
		{name: "flag falsy as 0", params: `{"do_remote_prefill":0,"remote_block_ids":[[3]],` + addr + `}`, leg: legWhole},
		{name: "flat block ids (earlier vLLM)", params: `{"do_remote_prefill":true,"remote_block_ids":[7,8],` + addr + `}`, leg: legDecode, pulls: true, ids: []uint32{7, 8}},
		{name: "one empty group is truthy", params: `{"do_remote_prefill":true,"remote_block_ids":[[]],` + addr + `}`, leg: legDecode, pulls: true, ids: []uint32{}},
		{name: "empty block ids", params: `{"do_remote_prefill":true,"remote_block_ids":[],` + addr + `}`, leg: legDecode, invalid: "remote_block_ids"},
		{name: "no block ids", params: `{"do_remote_prefill":true,` + addr + `}`, leg: legDecode, invalid: "remote_block_ids"},
		{name: "no host", params: `{"do_remote_prefill":true,"remote_block_ids":[[1]],"remote_engine_id":"p0","remote_request_id":"r1","remote_port":5600}`, leg: legDecode, invalid: "remote_host"},
		{name: "null host is present", params: `{"do_remote_prefill":true,"remote_block_ids":[[1]],"remote_engine_id":"p0","remote_request_id":"r1","remote_host":null,"remote_port":5600}`, leg: legDecode, pulls: true, bad: true},
		{name: "port out of range", params: `{"do_remote_prefill":true,"remote_block_ids":[[1]],"remote_engine_id":"p0","remote_request_id":"r1","remote_host":"h","remote_port":70000}`, leg: legDecode, pulls: true, bad: true},
		{name: "two KV-cache groups", params: `{"do_remote_prefill":true,"remote_block_ids":[[1],[2]],` + addr + `}`, leg: legDecode, pulls: true, bad: true},
		{name: "peer source", params: `{"remote_kv_source":{"kv_request_id":"u","remote_host":"10.0.0.8","remote_port":5601}}`, leg: legWhole, source: true},
		{name: "peer source without a port", params: `{"remote_kv_source":{"kv_request_id":"u","remote_host":"10.0.0.8"}}`, leg: legWhole},
		{name: "prefill leg that also pulls from a peer", params: `{"do_remote_decode":true,"remote_kv_source":{"kv_request_id":"u","remote_host":"h","remote_port":1}}`, leg: legPrefill, source: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			body := `{"prompt":"x","kv_transfer_params":` + c.params + `}`
			p := parseKVParams([]byte(body))
			if p == nil {
				t.Fatal("no params parsed")
			}
			if got := p.leg(); got != c.leg {
				t.Errorf("leg %q, want %q", got, c.leg)
			}
			if (p.remote != nil) != c.pulls {
				t.Fatalf("pulls %v (invalid %q), want %v", p.remote != nil, p.invalid, c.pulls)
			}
			if c.invalid != "" && !strings.Contains(p.invalid, c.invalid) {
				t.Errorf("invalid %q, want it to name %s", p.invalid, c.invalid)
			}
			if p.remote != nil {
				if (p.remote.bad != "") != c.bad {
					t.Errorf("bad %q, want bad %v", p.remote.bad, c.bad)
				}
				if !c.bad && !slices.Equal(p.remote.blockIDs, c.ids) {
					t.Errorf("block ids %v, want %v", p.remote.blockIDs, c.ids)
				}
			}
			if (p.source != nil) != c.source {
				t.Errorf("source %+v, want %v", p.source, c.source)
			}
		})
	}
	for _, body := range []string{`{"prompt":"x"}`, `{"prompt":"x","kv_transfer_params":null}`, `{"prompt":"x","kv_transfer_params":[1]}`,
		`{"prompt":"the kv_transfer_params are in the text"}`} {
		if p := parseKVParams([]byte(body)); p != nil {
			t.Errorf("%s: parsed %+v, want none", body, p)
		}
	}
}

// Python's truth values of JSON.
func TestTruthy(t *testing.T) {
	for raw, want := range map[string]bool{`true`: true, `false`: false, `null`: false, ``: false, `0`: false, `-0`: false,
		`0.0`: false, `1`: true, `-2.5`: true, `""`: false, `"0"`: true, `[]`: false, `[ ]`: false, `[0]`: true, `{}`: false,
		`{"a":0}`: true} {
		if got := truthy(json.RawMessage(raw)); got != want {
			t.Errorf("truthy(%s) = %v, want %v", raw, got, want)
		}
	}
}

// FuzzKVParams: whatever kv_transfer_params a client sends, reading them does not panic, and a
// pull the engine would dial names a host and a port.
func FuzzKVParams(f *testing.F) {
	for _, s := range []string{`{"do_remote_prefill":true,"remote_block_ids":[[1,2]],"remote_engine_id":"e","remote_request_id":"r","remote_host":"h","remote_port":1}`,
		`{"do_remote_decode":true}`, `{"remote_kv_source":{"kv_request_id":"u","remote_host":"h","remote_port":2}}`, `{"remote_block_ids":[1e40]}`, `null`} {
		f.Add([]byte(`{"prompt":"x","kv_transfer_params":` + s + `}`))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		p := parseKVParams(body)
		if p == nil {
			return
		}
		_ = p.leg()
		if rb := p.leasedRemote(); rb != nil && (rb.host == "" || rb.port < 1 || rb.port > 65535 || rb.requestID == "") {
			t.Fatalf("would dial %+v from %q", rb, body)
		}
		if s := p.source; s != nil && (s.host == "" || s.port < 1 || s.port > 65535) {
			t.Fatalf("would pull from %+v", s)
		}
	})
}

// FuzzSideChannel: whatever another engine sends the side channel, handling it does not panic,
// never answers 500, and an accepted pull or lookup answers well-formed blocks.
func FuzzSideChannel(f *testing.F) {
	toks := tokenPrompt(40, 100)
	hashes := local.BlockHashes(toks[:32], 16, 0)
	lookup, _ := json.Marshal(lookupRequest{Version: 1, BlockSize: 16, From: 0, Tokens: toks[:32], Hashes: hashes})
	for _, s := range []string{`{"version":1,"engine_id":"fuzz","request_id":"r","block_ids":[0,1]}`,
		`{"version":1,"engine_id":"fuzz","request_ids":["r"]}`, string(lookup),
		`{"version":1,"block_size":16,"from":-1,"tokens":[],"hashes":[]}`, `{"version":2}`, `[]`, `{"block_ids":[-1]}`} {
		for _, path := range []string{"/kv/pull", "/kv/heartbeat", "/kv/lookup"} {
			f.Add(path, []byte(s))
		}
	}
	cfg := fastConfig()
	cfg.EngineID = "fuzz"
	e, err := New(cfg, local.NewRadixTree(local.Options{}), nil, nil)
	if err != nil {
		f.Fatal(err)
	}
	if err := e.Start(f.Context()); err != nil {
		f.Fatal(err)
	}
	f.Cleanup(e.Close)
	h := e.sideHandler()
	f.Fuzz(func(t *testing.T, path string, body []byte) {
		req := httptest.NewRequest(http.MethodPost, "/kv/lookup", strings.NewReader(string(body)))
		if strings.HasPrefix(path, "/kv/") {
			req.URL.Path = path
		}
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("%s %q: %d %s", path, body, rec.Code, rec.Body)
		}
		if rec.Code == 200 && path != "/kv/heartbeat" && strings.HasPrefix(req.URL.Path, "/kv/") && req.URL.Path != "/kv/heartbeat" {
			var r blocksResponse
			if err := json.Unmarshal(rec.Body.Bytes(), &r); err != nil || r.Version != sideChannelVersion || r.BlockSize != 16 {
				t.Fatalf("%s answer %s: %v", req.URL.Path, rec.Body, err)
			}
			for _, b := range r.Blocks {
				if len(b.Tokens) == 0 || len(b.Tokens) > 16 {
					t.Fatalf("served a block of %d tokens", len(b.Tokens))
				}
			}
		}
	})
}
