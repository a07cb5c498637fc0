package simengine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
)

// kv_transfer_params, the per-request field through which a disaggregating proxy drives vLLM's
// NixlConnector (vllm-project/vllm tests/v1/kv_connector/nixl_integration/toy_proxy_server.py,
// send_request_to_service) and llm-d's sidecar drives a peer pull
// (llm-d/llm-d-router pkg/sidecar/proxy/connector_p2p.go, p2pSourceParams). The engine reads
// three shapes:
//
//   - a prefill leg: do_remote_decode true. The request runs normally; when it finishes (length
//     or stop, not aborted) its blocks stay pinned under a lease and the response carries the
//     params a decode engine needs (kvTransferOut).
//   - a decode leg: do_remote_prefill true. It pulls what its own cache lacks from the named
//     engine when remote_block_ids is non-empty and remote_engine_id, remote_request_id,
//     remote_host and remote_port are all present, exactly the test in NixlConnector's
//     update_state_after_alloc (vllm/distributed/kv_transfer/kv_connector/v1/nixl/
//     pull_scheduler.py); otherwise it logs "invalid KVTransferParams" and computes locally.
//   - a peer pull: remote_kv_source {kv_request_id, remote_host, remote_port} on any other
//     request: the prompt's blocks the peer holds are fetched before the rest is prefilled.
//
// Values are read with Python's truthiness where vLLM tests them with params.get(...), so a
// proxy that sends "do_remote_decode": 1 is served as vLLM would serve it.

// Request legs, as the request log line and the legs_total metric name them.
const (
	legWhole   = "whole"
	legPrefill = "prefill"
	legDecode  = "decode"
)

// kvParams is a request's kv_transfer_params as this engine acts on them.
type kvParams struct {
	remoteDecode bool // do_remote_decode: this is a prefill leg
	// remotePrefill is do_remote_prefill: this is a decode leg. remote holds its pull when the
	// params pass vLLM's test; invalid says why they did not (logged, then computed locally).
	remotePrefill bool
	remote        *remoteBlocks
	invalid       string
	source        *kvSource // remote_kv_source, when present and well-formed
}

// remoteBlocks is a decode leg's pull: the prefill engine and its leased blocks. bad is set when
// every required key is present but a value cannot be dialled or read (a null host, a string
// port): vLLM would try and fail to load, so this is a load failure under the policy, not an
// invalid request.
type remoteBlocks struct {
	engineID, requestID, host string
	port                      int
	blockIDs                  []uint32 // the one KV-cache group's block ids on the prefill engine
	bad                       string
}

// kvSource is llm-d's remote_kv_source: the peer to pull the prompt's cached blocks from.
type kvSource struct {
	requestID, host string
	port            int
}

// kvTransferOut is what a finished prefill leg answers in the response's top-level
// kv_transfer_params: the dict NixlConnector's request_finished returns on a prefill (P) node
// (vllm/distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py @0050936), field for
// field. remote_block_ids is one list per KV-cache group (BlockIds = tuple[list[int], ...] in
// vllm/distributed/kv_transfer/kv_connector/utils.py): this engine has one full-attention group.
// remote_blocks_expiry_time is set only on a decode node that keeps blocks for a turn-2 readback,
// so a prefill engine sends null; tp/dcp/pp sizes are 1 (one simulated GPU).
type kvTransferOut struct {
	DoRemotePrefill        bool       `json:"do_remote_prefill"`
	DoRemoteDecode         bool       `json:"do_remote_decode"`
	RemoteBlockIDs         [][]uint32 `json:"remote_block_ids"`
	RemoteEngineID         string     `json:"remote_engine_id"`
	RemoteRequestID        string     `json:"remote_request_id"`
	RemoteHost             string     `json:"remote_host"`
	RemotePort             int        `json:"remote_port"`
	TPSize                 int        `json:"tp_size"`
	DCPSize                int        `json:"dcp_size"`
	PPSize                 int        `json:"pp_size"`
	RemoteNumTokens        int        `json:"remote_num_tokens"`
	RemoteBlocksExpiryTime *float64   `json:"remote_blocks_expiry_time"`
	TransferMode           string     `json:"transfer_mode"`
}

// kvParamsKey is the request field; a body without these bytes has no params and is not
// decoded twice.
var kvParamsKey = []byte(`"kv_transfer_params"`)

// parseKVParams extracts kv_transfer_params from a generation body the shared parser has already
// accepted (so it is one valid JSON object). It returns nil when the field is absent, null or
// not an object (vLLM's protocol types it as an optional dict; the engine then serves the
// request whole).
func parseKVParams(body []byte) *kvParams {
	if !bytes.Contains(body, kvParamsKey) {
		return nil
	}
	var outer struct {
		KV map[string]json.RawMessage `json:"kv_transfer_params"`
	}
	if json.Unmarshal(body, &outer) != nil || outer.KV == nil {
		return nil
	}
	return kvParamsOf(outer.KV)
}

// kvParamsOf interprets the params object.
func kvParamsOf(m map[string]json.RawMessage) *kvParams {
	p := &kvParams{remoteDecode: truthy(m["do_remote_decode"]), remotePrefill: truthy(m["do_remote_prefill"])}
	if p.remotePrefill {
		p.remote, p.invalid = remoteOf(m)
	}
	if raw, ok := m["remote_kv_source"]; ok && truthy(raw) {
		var src map[string]json.RawMessage
		if json.Unmarshal(raw, &src) == nil {
			s := &kvSource{}
			okID := json.Unmarshal(src["kv_request_id"], &s.requestID) == nil
			okHost := json.Unmarshal(src["remote_host"], &s.host) == nil && s.host != ""
			var okPort bool
			s.port, okPort = portOf(src["remote_port"])
			if okID && okHost && okPort {
				p.source = s
			}
		}
	}
	return p
}

// remoteOf applies update_state_after_alloc's test: remote_block_ids truthy and every address
// key present. A present key with an unusable value makes the pull fail at load time (bad).
func remoteOf(m map[string]json.RawMessage) (*remoteBlocks, string) {
	if !truthy(m["remote_block_ids"]) {
		return nil, "remote_block_ids is missing or empty"
	}
	for _, k := range []string{"remote_engine_id", "remote_request_id", "remote_host", "remote_port"} {
		if _, ok := m[k]; !ok {
			return nil, k + " is missing"
		}
	}
	r := &remoteBlocks{}
	var ok bool
	var bad []string
	if json.Unmarshal(m["remote_engine_id"], &r.engineID) != nil {
		bad = append(bad, "remote_engine_id is not a string")
	}
	if json.Unmarshal(m["remote_request_id"], &r.requestID) != nil || r.requestID == "" {
		bad = append(bad, "remote_request_id is not a non-empty string")
	}
	if json.Unmarshal(m["remote_host"], &r.host) != nil || r.host == "" {
		bad = append(bad, "remote_host is not a non-empty string")
	}
	if r.port, ok = portOf(m["remote_port"]); !ok {
		bad = append(bad, "remote_port is not a port number")
	}
	if r.blockIDs, ok = blockIDsOf(m["remote_block_ids"]); !ok {
		bad = append(bad, "remote_block_ids is not one group of block ids")
	}
	if len(bad) > 0 {
		r.bad = fmt.Sprint(bad)
	}
	return r, ""
}

// blockIDsOf reads remote_block_ids: one list per KV-cache group as vLLM emits it now
// ([[1, 2, 3]]), or the flat list of earlier versions ([1, 2, 3]). The engine has one group.
func blockIDsOf(raw json.RawMessage) ([]uint32, bool) {
	var groups [][]uint32
	if json.Unmarshal(raw, &groups) == nil {
		if len(groups) != 1 {
			return nil, false
		}
		return groups[0], true
	}
	var flat []uint32
	if json.Unmarshal(raw, &flat) == nil {
		return flat, true
	}
	return nil, false
}

// portOf reads a TCP port (a JSON integer in 1..65535; vLLM sends side_channel_port as an int).
func portOf(raw json.RawMessage) (int, bool) {
	var f float64
	if json.Unmarshal(raw, &f) != nil || f != math.Trunc(f) || f < 1 || f > 65535 {
		return 0, false
	}
	return int(f), true
}

// truthy is Python's truth value of a JSON value, as params.get(key) is tested in vLLM: false,
// null, 0, "", [] and {} (and absence) are false, anything else true.
func truthy(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return false
	}
	switch raw[0] {
	case 't':
		return true
	case 'f', 'n':
		return false
	case '"':
		return len(raw) > 2
	case '[', '{':
		return len(bytes.TrimSpace(raw[1:len(raw)-1])) > 0
	}
	var f float64
	return json.Unmarshal(raw, &f) == nil && f != 0
}

// leg names the leg a request serves: a prefill leg if it leases its blocks for a decode
// engine, a decode leg if it was sent to pull them, else a whole request.
func (p *kvParams) leg() string {
	switch {
	case p == nil:
		return legWhole
	case p.remoteDecode:
		return legPrefill
	case p.remotePrefill:
		return legDecode
	}
	return legWhole
}

// leasedRemote is the prefill engine a decode leg will read from, when its params name one it
// can dial: the engine renews that lease while the leg waits and frees it if the leg gives up.
func (p *kvParams) leasedRemote() *remoteBlocks {
	if p == nil || !p.remotePrefill || p.remote == nil || p.remote.bad != "" {
		return nil
	}
	return p.remote
}
