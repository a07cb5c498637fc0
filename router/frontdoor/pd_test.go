package frontdoor

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixmesh/prefixmesh/cluster"
	"github.com/prefixmesh/prefixmesh/local"
	"github.com/prefixmesh/prefixmesh/router/requests"
	"github.com/prefixmesh/prefixmesh/routing"
)

// The front door's disaggregated legs against engines that answer as vLLM with NixlConnector
// and SGLang do. The expected bodies are written from the proxies the engines are driven by in
// their own tests: vLLM's tests/v1/kv_connector/nixl_integration/toy_proxy_server.py (prefill
// leg: kv_transfer_params.do_remote_decode with the remote fields null, stream false,
// max_tokens 1, no stream_options, min_tokens popped; decode leg: the client's body with the
// prefill answer's kv_transfer_params), SGLang's sgl-router mini_lb.py (one body to both, with
// bootstrap_host, bootstrap_port and bootstrap_room) and llm-d's connector_nixlv2.go (retries
// on 502/503/504 only; no kv_transfer_params: decode anyway).

// pdPromptTokens is the test prompt: four blocks of 16.
const pdPromptTokens = 64

// prefillAnswer is what vLLM's prefill engine answers a do_remote_decode request: one token
// (finish_reason length) and request_finished's kv_transfer_params (pull_scheduler.py).
const prefillParams = `{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[[7,8,9,10]],"remote_engine_id":"p0-engine","remote_request_id":"req-1","remote_host":"127.0.0.1","remote_port":5600,"tp_size":1}`

func prefillAnswer(cached int, params string) string {
	s := fmt.Sprintf(`{"id":"cmpl-p","object":"text_completion","model":%q,"choices":[{"index":0,"text":"a","finish_reason":"length"}],"usage":{"prompt_tokens":%d,"completion_tokens":1,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}`,
		simModel, pdPromptTokens, pdPromptTokens+1, cached)
	if params != "" {
		s += `,"kv_transfer_params":` + params
	}
	return s + "}"
}

// leg is one request an engine received.
type leg struct {
	body      []byte
	requestID string
}

// pdEngine is an engine that records its requests and answers with answer.
type pdEngine struct {
	mu     sync.Mutex
	legs   []leg
	answer func(w http.ResponseWriter, r *http.Request, n int, body []byte) // n: this request's index
}

func (e *pdEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	e.mu.Lock()
	e.legs = append(e.legs, leg{body: b, requestID: r.Header.Get("X-Request-Id")})
	n := len(e.legs) - 1
	e.mu.Unlock()
	e.answer(w, r, n, b)
}

func (e *pdEngine) got() []leg {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]leg(nil), e.legs...)
}

// decodeAnswer answers as vLLM's decode engine does after a pull: cached_tokens = prompt − 1.
func decodeAnswer(w http.ResponseWriter, _ *http.Request, _ int, body []byte) {
	usage := fmt.Sprintf(`{"prompt_tokens":%d,"completion_tokens":2,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}`,
		pdPromptTokens, pdPromptTokens+2, pdPromptTokens-1)
	w.Header().Set(requests.HeaderCachedTokens, fmt.Sprint(pdPromptTokens-1))
	var req struct {
		Stream bool `json:"stream"`
	}
	_ = json.Unmarshal(body, &req)
	if req.Stream {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: {\"id\":\"cmpl-d\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\"b\",\"finish_reason\":null}]}\n\n")
		fmt.Fprintf(w, "data: {\"id\":\"cmpl-d\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\"c\",\"finish_reason\":\"length\"}]}\n\n")
		fmt.Fprintf(w, "data: {\"id\":\"cmpl-d\",\"object\":\"text_completion\",\"choices\":[],\"usage\":%s}\n\n", usage)
		fmt.Fprintf(w, "data: [DONE]\n\n")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"id":"cmpl-d","object":"text_completion","choices":[{"index":0,"text":"bc","finish_reason":"length"}],"usage":%s}`, usage)
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// connectorList is a node list whose nodes speak conn and name peer addresses.
type connectorList struct {
	*nodeList
	conn cluster.KVConnector
	port uint16
	peer map[string]string // node id → KV peer address
}

func (l connectorList) NodeKV(id string) (requests.NodeKV, bool) {
	return requests.NodeKV{Connector: l.conn, BootstrapPort: l.port, PeerAddr: l.peer[id]}, true
}

// pdFleet is a front door over one prefill and one decode engine, disaggregating always.
type pdFleet struct {
	*fleet
	prefill, decode *pdEngine
}

func startPDFleet(t *testing.T, prefill, decode *pdEngine, conn cluster.KVConnector) *pdFleet {
	t.Helper()
	ps, ds := httptestServer(t, prefill), httptestServer(t, decode)
	p, d := target("p0", ps.URL), target("d0", ds.URL)
	p.Info.Role, d.Info.Role = routing.RolePrefill, routing.RoleDecode
	f := startFrontDoor(t, []requests.NodeTarget{p, d}, fleetOpts{policy: routing.PolicyPrefixMesh,
		pickerCfg: requests.PolicyPickerConfig{Disaggregate: routing.DisaggAlways}})
	if conn != cluster.KVConnectorNone {
		// The picker reads connectors from its node source: rebuild it over a list that says.
		src := connectorList{nodeList: f.list, conn: conn, port: 8998}
		pol := must(routing.NewPolicy(routing.PolicyPrefixMesh, routing.DefaultPolicyConfig()))
		pk := must(requests.NewPolicyPicker(src, f.index, routing.NewOverlay(0, 0), pol, requests.PolicyPickerConfig{Disaggregate: routing.DisaggAlways}))
		f.svc = newServiceWith(t, requests.DefaultConfig(), requests.Deps{Picker: pk, Health: f.tap, Nodes: f.list, Registry: nil})
		fd := must(New(DefaultConfig(), Deps{Service: f.svc, Logger: newTestLogger(f.logs)}))
		f.srv = httptestServer(t, fd.Handler())
		f.picker = pk
	}
	return &pdFleet{fleet: f, prefill: prefill, decode: decode}
}

func pdClientBody(stream bool) map[string]any {
	ids := make([]int, pdPromptTokens)
	for i := range ids {
		ids[i] = 1000 + i
	}
	b := map[string]any{"model": simModel, "prompt": ids, "max_tokens": 8, "min_tokens": 2, "stream": stream}
	if stream {
		b["stream_options"] = map[string]any{"include_usage": true}
	}
	return b
}

// object decodes a JSON object into raw members.
func object(t *testing.T, b []byte) map[string]json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("body %q: %v", b, err)
	}
	return m
}

func TestPDNIXLLegs(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			prefill := &pdEngine{answer: func(w http.ResponseWriter, _ *http.Request, _ int, _ []byte) {
				w.Header().Set("Content-Type", "application/json")
				io.WriteString(w, prefillAnswer(32, prefillParams))
			}}
			decode := &pdEngine{answer: decodeAnswer}
			f := startPDFleet(t, prefill, decode, cluster.KVConnectorNone)
			client := pdClientBody(stream)
			r, err := do(t.Context(), f.srv.Client(), f.srv.URL, "/v1/completions", client, nil)
			if err != nil {
				t.Fatal(err)
			}
			if r.status != http.StatusOK {
				t.Fatalf("status %d: %+v", r.status, r.errBody)
			}
			// The client is told what the prefill leg's cache saved, not the decode engine's
			// prompt − 1, in the body and the header.
			if r.usage == nil || r.usage.PromptTokensDetails.CachedTokens != 32 || r.cached != 32 {
				t.Fatalf("cached_tokens: body %+v header %d, want 32 (the prefill leg's)", r.usage, r.cached)
			}
			if r.text != "bc" || r.header.Get(HeaderNode) != "d0" || r.header.Get(HeaderPrefillNode) != "p0" {
				t.Fatalf("answer %q from %q, prefill %q: want the decode node's text from d0 with p0's prefill",
					r.text, r.header.Get(HeaderNode), r.header.Get(HeaderPrefillNode))
			}
			pl, dl := prefill.got(), decode.got()
			if len(pl) != 1 || len(dl) != 1 {
				t.Fatalf("legs: %d prefill, %d decode; want one each", len(pl), len(dl))
			}
			if pl[0].requestID == "" || pl[0].requestID != dl[0].requestID {
				t.Fatalf("X-Request-Id: prefill %q, decode %q; want the same on both", pl[0].requestID, dl[0].requestID)
			}
			want := object(t, must(json.Marshal(client)))
			p := object(t, pl[0].body)
			if string(p["stream"]) != "false" || string(p["max_tokens"]) != "1" {
				t.Errorf("prefill leg: stream %s max_tokens %s, want false and 1", p["stream"], p["max_tokens"])
			}
			for _, k := range []string{"min_tokens", "stream_options"} {
				if _, has := p[k]; has {
					t.Errorf("prefill leg carries %s: the toy proxy removes it", k)
				}
			}
			if got := string(p["kv_transfer_params"]); got != `{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}` {
				t.Errorf("prefill leg's kv_transfer_params %s", got)
			}
			if !bytes.Equal(p["prompt"], want["prompt"]) || !bytes.Equal(p["model"], want["model"]) {
				t.Errorf("prefill leg's prompt or model changed")
			}
			d := object(t, dl[0].body)
			if string(d["kv_transfer_params"]) != prefillParams {
				t.Errorf("decode leg's kv_transfer_params %s, want the prefill answer's unchanged %s", d["kv_transfer_params"], prefillParams)
			}
			for k, v := range want {
				if !bytes.Equal(d[k], v) {
					t.Errorf("decode leg's %s = %s, want the client's %s", k, d[k], v)
				}
			}
			if len(d) != len(want)+1 {
				t.Errorf("decode leg has %d members, want the client's %d and kv_transfer_params", len(d), len(want))
			}
			if got := counterValue(t, f.reg, "prefixmesh_frontdoor_prefill_legs_total"); got != 1 {
				t.Errorf("prefill_legs_total = %v, want 1", got)
			}
			// A stream's first token after the prefill leg's answer times the transfer.
			if got, want := f.picker.Decider().TransferFit().Samples > 0, stream; got != want {
				t.Errorf("transfer learned: %v, want %v (streams only)", got, want)
			}
		})
	}
}

func TestPDPrefillRetriedOn503(t *testing.T) {
	prefill := &pdEngine{answer: func(w http.ResponseWriter, _ *http.Request, n int, _ []byte) {
		if n == 0 {
			http.Error(w, `{"error":{"message":"busy"}}`, http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, prefillAnswer(16, prefillParams))
	}}
	decode := &pdEngine{answer: decodeAnswer}
	f := startPDFleet(t, prefill, decode, cluster.KVConnectorNone)
	r, err := do(t.Context(), f.srv.Client(), f.srv.URL, "/v1/completions", pdClientBody(false), nil)
	if err != nil || r.status != http.StatusOK {
		t.Fatalf("status %v err %v", r, err)
	}
	if n := len(prefill.got()); n != 2 {
		t.Fatalf("prefill legs sent: %d, want 2 (one retry after 503)", n)
	}
	if d := object(t, decode.got()[0].body); string(d["kv_transfer_params"]) != prefillParams {
		t.Fatalf("decode leg after the retry lacks the prefill's params: %s", d["kv_transfer_params"])
	}
	if r.usage.PromptTokensDetails.CachedTokens != 16 {
		t.Fatalf("cached_tokens %d, want the retried prefill leg's 16", r.usage.PromptTokensDetails.CachedTokens)
	}
}

func TestPDPrefillWithoutParamsDecodesLocally(t *testing.T) {
	prefill := &pdEngine{answer: func(w http.ResponseWriter, _ *http.Request, _ int, _ []byte) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, prefillAnswer(16, ""))
	}}
	decode := &pdEngine{answer: decodeAnswer}
	f := startPDFleet(t, prefill, decode, cluster.KVConnectorNone)
	client := must(json.Marshal(pdClientBody(false)))
	r, err := do(t.Context(), f.srv.Client(), f.srv.URL, "/v1/completions", client, nil)
	if err != nil || r.status != http.StatusOK {
		t.Fatalf("status %v err %v", r, err)
	}
	if got := decode.got()[0].body; !bytes.Equal(got, client) {
		t.Fatalf("decode leg body %s, want the client's unchanged %s", got, client)
	}
	// The decode engine prefilled itself: its own count stands, and the answer names no
	// prefill node.
	if p := r.header.Get(HeaderPrefillNode); p != "" {
		t.Fatalf("%s: %q after a prefill leg without params", HeaderPrefillNode, p)
	}
	if r.usage.PromptTokensDetails.CachedTokens != pdPromptTokens-1 {
		t.Fatalf("cached_tokens %d, want the decode engine's own %d", r.usage.PromptTokensDetails.CachedTokens, pdPromptTokens-1)
	}
	if got := counterValue(t, f.reg, "prefixmesh_frontdoor_prefill_legs_total"); got != 1 {
		t.Fatalf("prefill_legs_total %v", got)
	}
}

func TestPDPrefillErrors(t *testing.T) {
	t.Run("500 goes to the client", func(t *testing.T) {
		prefill := &pdEngine{answer: func(w http.ResponseWriter, _ *http.Request, _ int, _ []byte) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusInternalServerError)
			io.WriteString(w, `{"error":{"message":"engine fault","type":"InternalServerError","code":"internal_error"}}`)
		}}
		decode := &pdEngine{answer: decodeAnswer}
		f := startPDFleet(t, prefill, decode, cluster.KVConnectorNone)
		r, err := do(t.Context(), f.srv.Client(), f.srv.URL, "/v1/completions", pdClientBody(false), nil)
		if err != nil {
			t.Fatal(err)
		}
		if r.status != http.StatusInternalServerError || r.errBody == nil || r.errBody.Error.Message != "engine fault" {
			t.Fatalf("got %d %+v, want the prefill engine's 500 and body", r.status, r.errBody)
		}
		if len(prefill.got()) != 1 || len(decode.got()) != 0 {
			t.Fatalf("legs %d/%d: a 500 is not retried and no decode leg follows", len(prefill.got()), len(decode.got()))
		}
	})
	t.Run("unreachable: decode prefills", func(t *testing.T) {
		prefill := &pdEngine{answer: func(w http.ResponseWriter, _ *http.Request, _ int, _ []byte) {}}
		decode := &pdEngine{answer: decodeAnswer}
		f := startPDFleet(t, prefill, decode, cluster.KVConnectorNone)
		// The prefill engine goes away after the fleet is listed.
		f.list.mu.Lock()
		f.list.nodes[0].EngineURL = "http://127.0.0.1:1"
		f.list.mu.Unlock()
		client := must(json.Marshal(pdClientBody(false)))
		r, err := do(t.Context(), f.srv.Client(), f.srv.URL, "/v1/completions", client, nil)
		if err != nil || r.status != http.StatusOK {
			t.Fatalf("status %v err %v: an unreachable prefill node is never the client's error", r, err)
		}
		if got := decode.got(); len(got) != 1 || !bytes.Equal(got[0].body, client) {
			t.Fatalf("decode legs %d: want one with the client's body", len(got))
		}
		if p := r.header.Get(HeaderPrefillNode); p != "" {
			t.Fatalf("%s: %q after a failed prefill leg", HeaderPrefillNode, p)
		}
	})
}

func TestPDSGLangLegs(t *testing.T) {
	prefill := &pdEngine{answer: func(w http.ResponseWriter, _ *http.Request, _ int, _ []byte) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, prefillAnswer(48, ""))
	}}
	decode := &pdEngine{answer: decodeAnswer}
	f := startPDFleet(t, prefill, decode, cluster.KVConnectorSGLang)
	client := pdClientBody(false)
	r, err := do(t.Context(), f.srv.Client(), f.srv.URL, "/v1/completions", client, nil)
	if err != nil || r.status != http.StatusOK {
		t.Fatalf("status %v err %v", r, err)
	}
	pl, dl := prefill.got(), decode.got()
	if len(pl) != 1 || len(dl) != 1 || !bytes.Equal(pl[0].body, dl[0].body) {
		t.Fatalf("legs %d/%d: want one each with the identical body (mini_lb)", len(pl), len(dl))
	}
	m := object(t, dl[0].body)
	if string(m["bootstrap_host"]) != `"127.0.0.1"` || string(m["bootstrap_port"]) != "8998" {
		t.Fatalf("bootstrap host %s port %s", m["bootstrap_host"], m["bootstrap_port"])
	}
	var room uint64
	if err := json.Unmarshal(m["bootstrap_room"], &room); err != nil || room >= 1<<63 {
		t.Fatalf("bootstrap_room %s: want an integer in [0, 2^63)", m["bootstrap_room"])
	}
	want := object(t, must(json.Marshal(client)))
	for k, v := range want {
		if !bytes.Equal(m[k], v) {
			t.Errorf("%s = %s, want the client's %s", k, m[k], v)
		}
	}
	if r.usage.PromptTokensDetails.CachedTokens != 48 {
		t.Fatalf("cached_tokens %d, want the prefill leg's 48", r.usage.PromptTokensDetails.CachedTokens)
	}
}

func TestPDSGLangPrefillFailureFailsDecode(t *testing.T) {
	release := make(chan struct{})
	prefill := &pdEngine{answer: func(w http.ResponseWriter, _ *http.Request, _ int, _ []byte) {
		http.Error(w, "bootstrap failed", http.StatusInternalServerError)
	}}
	// The decode engine waits for KV that never comes, until the router gives up on it.
	decode := &pdEngine{answer: func(w http.ResponseWriter, r *http.Request, _ int, _ []byte) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}}
	defer close(release)
	f := startPDFleet(t, prefill, decode, cluster.KVConnectorSGLang)
	r, err := do(t.Context(), f.srv.Client(), f.srv.URL, "/v1/completions", pdClientBody(false), nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.status < 500 {
		t.Fatalf("status %d: a failed prefill leg fails the request", r.status)
	}
	if f.health.Ejected("d0") {
		t.Fatal("the decode node was blamed for its prefill leg's failure")
	}
}

// A peer pull through the front door: the holder of the prompt's prefix is busy (20 s of queued
// prefill), so the request goes to an idle node, with kv_transfer_params.remote_kv_source naming
// the holder's KV endpoint as llm-d's sidecar writes it (connector_p2p.go: kv_request_id,
// remote_host, remote_port) and the request id it names; the rest of the body is the client's.
func TestPeerPullNamesTheHolder(t *testing.T) {
	const prompt = 2048
	idle := &pdEngine{answer: decodeAnswer}
	holder := &pdEngine{answer: func(w http.ResponseWriter, _ *http.Request, _ int, _ []byte) {
		t.Error("the busy holder was sent the request")
	}}
	is, hs := httptestServer(t, idle), httptestServer(t, holder)
	a, h := target("a", is.URL), target("h", hs.URL)
	h.Info.QueuedPrefillTokens = 200000
	f := startFrontDoor(t, []requests.NodeTarget{a, h}, fleetOpts{policy: routing.PolicyPrefixMesh})
	ids := make([]uint32, prompt)
	for i := range ids {
		ids[i] = uint32(1000 + i)
	}
	f.index.ReplaceNode("a", 1, 1, nil)
	f.index.ReplaceNode("h", 1, 1, local.BlockHashes(ids, 16, 0))
	src := connectorList{nodeList: f.list, peer: map[string]string{"h": "10.9.8.7:5600"}}
	pol := must(routing.NewPolicy(routing.PolicyPrefixMesh, routing.DefaultPolicyConfig()))
	pk := must(requests.NewPolicyPicker(src, f.index, routing.NewOverlay(0, 0), pol, requests.PolicyPickerConfig{}))
	svc := newServiceWith(t, requests.DefaultConfig(), requests.Deps{Picker: pk, Nodes: f.list})
	reg := prometheus.NewRegistry()
	fd := must(New(DefaultConfig(), Deps{Service: svc, Registry: reg, Logger: newTestLogger(f.logs)}))
	srv := httptestServer(t, fd.Handler())
	client := map[string]any{"model": simModel, "prompt": ids, "max_tokens": 4}
	r, err := do(t.Context(), srv.Client(), srv.URL, "/v1/completions", client, http.Header{"X-Request-Id": {"req-42"}})
	if err != nil || r.status != http.StatusOK {
		t.Fatalf("status %v err %v", r, err)
	}
	if r.header.Get(HeaderNode) != "a" {
		t.Fatalf("served by %q, want the idle node a", r.header.Get(HeaderNode))
	}
	// The estimate is what a will report cached: the pulled blocks, all but the last token's.
	if r.estimate != prompt-16 {
		t.Fatalf("estimate %d, want %d (the pulled run)", r.estimate, prompt-16)
	}
	got := idle.got()
	if len(got) != 1 {
		t.Fatalf("%d requests on a", len(got))
	}
	m := object(t, got[0].body)
	if string(m["kv_transfer_params"]) != `{"remote_kv_source":{"kv_request_id":"req-42","remote_host":"10.9.8.7","remote_port":5600}}` {
		t.Fatalf("kv_transfer_params %s", m["kv_transfer_params"])
	}
	want := object(t, must(json.Marshal(client)))
	for k, v := range want {
		if !bytes.Equal(m[k], v) {
			t.Errorf("%s = %s, want the client's %s", k, m[k], v)
		}
	}
	if n := counterValue(t, reg, "prefixmesh_frontdoor_peer_pulls_total"); n != 1 {
		t.Fatalf("peer_pulls_total %v", n)
	}
}
