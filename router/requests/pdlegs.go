package requests

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// The bodies of a disaggregated request's legs, as the upstream proxies write them
// (docs/disaggregation.md). Each edits the client's JSON object at its top level the way those
// proxies edit a Python dict: a member set again keeps its place, a new one goes last, a deleted
// one is gone; every other member, and its value's bytes, pass unchanged.
//
//   - vLLM with NixlConnector (vllm-project/vllm, tests/v1/kv_connector/nixl_integration/
//     toy_proxy_server.py, send_request_to_service and _handle_completions): the prefill leg is a
//     copy with kv_transfer_params {do_remote_decode: true, do_remote_prefill: false,
//     remote_engine_id, remote_block_ids, remote_host, remote_port: null}, stream false,
//     max_tokens 1, max_completion_tokens 1 when present, stream_options deleted, min_tokens and
//     min_completion_tokens removed; the decode leg is the client's body with kv_transfer_params
//     set to the prefill response's, when it returned any.
//   - SGLang (sgl-project/sglang, sgl-router/py_src/sglang_router/mini_lb.py,
//     _forward_to_backend): both legs get the same body, the client's with bootstrap_host,
//     bootstrap_port and bootstrap_room added.
//   - llm-d's P2P sidecar (llm-d/llm-d-router, pkg/sidecar/proxy/connector_p2p.go): a peer pull
//     sets kv_transfer_params to {remote_kv_source: {kv_request_id, remote_host, remote_port}},
//     replacing any value the client sent.

// errNotObject is a body whose top level is not a JSON object.
var errNotObject = errors.New("the request body is not a JSON object")

type member struct {
	key string
	val []byte // the value's JSON, as written
}

// object is a JSON object's top-level members in order.
type object []member

func parseObject(body []byte) (object, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, errNotObject
	}
	var o object
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("%w: %v", errNotObject, err)
		}
		key, _ := t.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, fmt.Errorf("%w: member %q: %v", errNotObject, key, err)
		}
		o = o.set(key, raw) // a repeated key: the last wins, in the first one's place (as Python's json.loads)
	}
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("%w: %v", errNotObject, err)
	}
	return o, nil
}

func (o object) index(key string) int {
	for i := range o {
		if o[i].key == key {
			return i
		}
	}
	return -1
}

// set gives key the value val: in its place if present, else last.
func (o object) set(key string, val []byte) object {
	if i := o.index(key); i >= 0 {
		o[i].val = val
		return o
	}
	return append(o, member{key, val})
}

func (o object) del(key string) object {
	if i := o.index(key); i >= 0 {
		return append(o[:i], o[i+1:]...)
	}
	return o
}

func (o object) get(key string) ([]byte, bool) {
	if i := o.index(key); i >= 0 {
		return o[i].val, true
	}
	return nil, false
}

// encode writes the object compactly.
func (o object) encode() []byte {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, m := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(m.key)
		b.Write(k)
		b.WriteByte(':')
		if err := json.Compact(&b, m.val); err != nil {
			b.Write(m.val) // parsed as JSON already: cannot fail
		}
	}
	b.WriteByte('}')
	return b.Bytes()
}

// nixlPrefillParams is what vLLM's toy proxy asks a prefill engine for.
var nixlPrefillParams = []byte(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)

// NIXLPrefillBody is the prefill leg's body for a vLLM NixlConnector pair.
func NIXLPrefillBody(client []byte) ([]byte, error) {
	o, err := parseObject(client)
	if err != nil {
		return nil, err
	}
	o = o.set("kv_transfer_params", nixlPrefillParams)
	o = o.set("stream", []byte("false"))
	o = o.set("max_tokens", []byte("1"))
	if _, ok := o.get("max_completion_tokens"); ok {
		o = o.set("max_completion_tokens", []byte("1"))
	}
	o = o.del("stream_options").del("min_tokens").del("min_completion_tokens")
	return o.encode(), nil
}

// NIXLDecodeBody is the decode leg's body: the client's, with kv_transfer_params set to the
// prefill response's (copied as sent); the client's body unchanged when params is empty (the
// decode engine then prefills itself).
func NIXLDecodeBody(client []byte, params []byte) ([]byte, error) {
	o, err := parseObject(client)
	if err != nil {
		return nil, err
	}
	if len(params) > 0 {
		o = o.set("kv_transfer_params", params)
	}
	return o.encode(), nil
}

// KVTransferParams returns the top-level kv_transfer_params of a prefill leg's JSON response,
// when it is a non-empty object (the proxy's `if kv_transfer_params:`).
func KVTransferParams(resp []byte) ([]byte, bool) {
	o, err := parseObject(resp)
	if err != nil {
		return nil, false
	}
	v, ok := o.get("kv_transfer_params")
	if !ok {
		return nil, false
	}
	p, err := parseObject(v)
	if err != nil || len(p) == 0 {
		return nil, false
	}
	return v, true
}

// SGLangBody is both legs' body for an SGLang prefill/decode pair: the client's with the
// prefill server's bootstrap host (an IPv6 address in brackets), port and the request's room.
func SGLangBody(client []byte, host string, port int, room uint64) ([]byte, error) {
	o, err := parseObject(client)
	if err != nil {
		return nil, err
	}
	if bytes.IndexByte([]byte(host), ':') >= 0 && host[0] != '[' {
		host = "[" + host + "]"
	}
	h, _ := json.Marshal(host)
	o = o.set("bootstrap_host", h)
	o = o.set("bootstrap_port", []byte(strconv.Itoa(port)))
	o = o.set("bootstrap_room", []byte(strconv.FormatUint(room, 10)))
	return o.encode(), nil
}

// PeerPullBody is the body of a request served on one node that pulls the prompt's KV from a
// peer: kv_transfer_params.remote_kv_source names the peer and the transfer's id.
func PeerPullBody(client []byte, kvRequestID, host string, port int) ([]byte, error) {
	o, err := parseObject(client)
	if err != nil {
		return nil, err
	}
	src, _ := json.Marshal(struct {
		ID   string `json:"kv_request_id"`
		Host string `json:"remote_host"`
		Port int    `json:"remote_port"`
	}{kvRequestID, host, port})
	o = o.set("kv_transfer_params", append(append([]byte(`{"remote_kv_source":`), src...), '}'))
	return o.encode(), nil
}

// RewriteCachedTokens sets usage.prompt_tokens_details.cached_tokens in a JSON response (or one
// SSE data payload) to cached, when the payload has usage.prompt_tokens_details: a decode engine
// counts the KV it pulled as cached (vLLM reports prompt_tokens − 1), so the client gets the
// prefill leg's count instead, as llm-d's sidecar does (pkg/sidecar/proxy/
// cached_tokens_usage_rewriter.go). ok is false when there was nothing to rewrite.
func RewriteCachedTokens(payload []byte, cached int) (out []byte, ok bool) {
	o, err := parseObject(payload)
	if err != nil {
		return payload, false
	}
	u, has := o.get("usage")
	if !has {
		return payload, false
	}
	uo, err := parseObject(u)
	if err != nil {
		return payload, false
	}
	d, has := uo.get("prompt_tokens_details")
	if !has {
		return payload, false
	}
	do, err := parseObject(d)
	if err != nil {
		return payload, false
	}
	do = do.set("cached_tokens", []byte(strconv.Itoa(cached)))
	uo = uo.set("prompt_tokens_details", do.encode())
	o = o.set("usage", uo.encode())
	return o.encode(), true
}
