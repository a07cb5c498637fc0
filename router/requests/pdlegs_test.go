package requests

import (
	"testing"
)

// The legs' bodies, each expected value written by hand from what the upstream proxy does to the
// client's dict (cited in pdlegs.go): a member set again keeps its place, a new one goes last.
func TestNIXLLegBodies(t *testing.T) {
	for _, c := range []struct {
		name, client, prefill, decode string
	}{
		{
			name:   "completions, streamed, with min_tokens and stream_options",
			client: `{"model":"m","prompt":[1,2,3],"max_tokens":64,"stream":true,"stream_options":{"include_usage":true},"min_tokens":4,"temperature":0.7}`,
			// stream and max_tokens in place; stream_options and min_tokens gone; params last.
			prefill: `{"model":"m","prompt":[1,2,3],"max_tokens":1,"stream":false,"temperature":0.7,"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}}`,
			// The client's body as sent, with the prefill's params last.
			decode: `{"model":"m","prompt":[1,2,3],"max_tokens":64,"stream":true,"stream_options":{"include_usage":true},"min_tokens":4,"temperature":0.7,"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[[7,8]],"remote_engine_id":"e1","remote_request_id":"r1","remote_host":"10.0.0.2","remote_port":5600}}`,
		},
		{
			name:   "chat, not streamed, max_completion_tokens and min_completion_tokens",
			client: `{"messages":[{"role":"user","content":"hi"}],"model":"m","max_completion_tokens":32,"min_completion_tokens":2}`,
			// No stream member before: stream and max_tokens are new, so last, after params.
			prefill: `{"messages":[{"role":"user","content":"hi"}],"model":"m","max_completion_tokens":1,"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null},"stream":false,"max_tokens":1}`,
			decode:  `{"messages":[{"role":"user","content":"hi"}],"model":"m","max_completion_tokens":32,"min_completion_tokens":2,"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[[7,8]],"remote_engine_id":"e1","remote_request_id":"r1","remote_host":"10.0.0.2","remote_port":5600}}`,
		},
		{
			name:    "client params replaced in place",
			client:  `{"kv_transfer_params":{"x":1},"model":"m","prompt":"p"}`,
			prefill: `{"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null},"model":"m","prompt":"p","stream":false,"max_tokens":1}`,
			decode:  `{"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[[7,8]],"remote_engine_id":"e1","remote_request_id":"r1","remote_host":"10.0.0.2","remote_port":5600},"model":"m","prompt":"p"}`,
		},
	} {
		p, err := NIXLPrefillBody([]byte(c.client))
		if err != nil || string(p) != c.prefill {
			t.Errorf("%s: prefill\n got %s %v\nwant %s", c.name, p, err, c.prefill)
		}
		resp := `{"id":"cmpl-1","choices":[{"text":"x","finish_reason":"length"}],"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[[7,8]],"remote_engine_id":"e1","remote_request_id":"r1","remote_host":"10.0.0.2","remote_port":5600}}`
		params, ok := KVTransferParams([]byte(resp))
		if !ok {
			t.Fatal("params not found")
		}
		d, err := NIXLDecodeBody([]byte(c.client), params)
		if err != nil || string(d) != c.decode {
			t.Errorf("%s: decode\n got %s %v\nwant %s", c.name, d, err, c.decode)
		}
	}
	// A prefill answer without params (or with an empty object): the decode leg is the client's
	// body and the engine prefills itself.
	for _, resp := range []string{`{"id":"x"}`, `{"kv_transfer_params":{}}`, `{"kv_transfer_params":null}`, `not json`} {
		if _, ok := KVTransferParams([]byte(resp)); ok {
			t.Errorf("%s: params found", resp)
		}
	}
	if d, _ := NIXLDecodeBody([]byte(`{"model":"m", "prompt": "p"}`), nil); string(d) != `{"model":"m","prompt":"p"}` {
		t.Errorf("no params: %s", d)
	}
	for _, bad := range []string{`[1]`, `"x"`, `{"a":}`, ``} {
		if _, err := NIXLPrefillBody([]byte(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// SGLang's mini load balancer adds the bootstrap triple last; an IPv6 host is bracketed.
func TestSGLangBody(t *testing.T) {
	b, err := SGLangBody([]byte(`{"model":"m","messages":[],"stream":true}`), "10.0.0.3", 8998, 42)
	if want := `{"model":"m","messages":[],"stream":true,"bootstrap_host":"10.0.0.3","bootstrap_port":8998,"bootstrap_room":42}`; err != nil || string(b) != want {
		t.Errorf("got %s %v\nwant %s", b, err, want)
	}
	b, _ = SGLangBody([]byte(`{"model":"m"}`), "fd00::3", 8998, 9223372036854775807)
	if want := `{"model":"m","bootstrap_host":"[fd00::3]","bootstrap_port":8998,"bootstrap_room":9223372036854775807}`; string(b) != want {
		t.Errorf("got %s\nwant %s", b, want)
	}
}

// llm-d's P2P sidecar replaces any client kv_transfer_params with the source.
func TestPeerPullBody(t *testing.T) {
	b, err := PeerPullBody([]byte(`{"kv_transfer_params":{"a":1},"model":"m"}`), "req-1", "10.0.0.4", 5700)
	if want := `{"kv_transfer_params":{"remote_kv_source":{"kv_request_id":"req-1","remote_host":"10.0.0.4","remote_port":5700}},"model":"m"}`; err != nil || string(b) != want {
		t.Errorf("got %s %v\nwant %s", b, err, want)
	}
}

// The decode leg's usage gets the prefill leg's cached_tokens, in a JSON answer and an SSE data
// payload alike; a payload without usage details is left alone.
func TestRewriteCachedTokens(t *testing.T) {
	in := `{"id":"c","usage":{"prompt_tokens":100,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":99}}}`
	out, ok := RewriteCachedTokens([]byte(in), 48)
	if want := `{"id":"c","usage":{"prompt_tokens":100,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":48}}}`; !ok || string(out) != want {
		t.Errorf("got %s\nwant %s", out, want)
	}
	for _, none := range []string{`{"id":"c","choices":[]}`, `{"usage":null}`, `{"usage":{"prompt_tokens":3}}`, `[DONE]`} {
		if out, ok := RewriteCachedTokens([]byte(none), 1); ok || string(out) != none {
			t.Errorf("%s rewritten: %s", none, out)
		}
	}
}
