package simengine

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/prefixmesh/prefixmesh/local"
)

// Pulling KV from another engine, after admission: the request has looked its own cache up
// (GPU prefix, then the CPU tier), holds blocks for the whole prompt and a slot, and now fetches
// over the side channel what it lacks before the rest is prefilled; the steps skip it meanwhile.
//
//   - A decode leg pulls every prompt token past its local hit from the prefill engine's lease,
//     as NixlConnector's get_num_new_matched_tokens counts them (len(prompt) −
//     num_computed_tokens, vllm/distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py),
//     partial last block included. vLLM then marks the whole prompt computed but the last token,
//     which it recomputes to sample from (vllm/v1/core/sched/scheduler.py,
//     _update_waiting_for_remote_kv: num_computed_tokens −1 when it equals num_tokens), and
//     reports every transferred token as cached: cached_tokens = prompt_tokens − 1 on the decode
//     engine, whatever the prefix cache saved. The engine reports the same, so that a
//     router reading cached_tokens sees what vLLM would show it; the prefill leg's cached_tokens
//     is the one that says what the cache saved.
//   - A peer pull fetches the run of full blocks past the local hit that the peer holds (up to
//     the last one vLLM would count as cached), as llm-d's P2P tier loads them as ordinary hits
//     (llm-d/llm-d-router pkg/sidecar/proxy/connector_p2p.go; the OffloadingConnector's p2p tier):
//     they count as cached like a CPU-tier hit, and the rest is prefilled.
//
// The transfer is charged at KVTransferTokensPerSec, after any CPU-tier load and before the
// prefill, the sequence waiting outside the steps while others compute (vLLM's
// WAITING_FOR_REMOTE_KVS), as the trace simulator's decode legs wait. The pulled blocks are
// inserted with the rest of the prompt after prefill, so the KV events show them as ordinary GPU
// stores.

// Pull kinds and outcomes, as the metrics label them.
const (
	pullDecode = "decode" // a decode leg reading a prefill leg's lease
	pullPeer   = "peer"   // a peer pull (remote_kv_source)

	outcomeOK        = "ok"
	outcomeRecompute = "recompute"
	outcomeFail      = "fail"
)

// pullResult is what a pull gave an admitted request.
type pullResult struct {
	kind    string
	outcome string
	tokens  int // prompt tokens moved from the peer
	cached  int // cached_tokens to report
	err     error
}

// pull runs the admitted request's pull, if it has one, and charges it. A result with outcome
// fail means the request must end with an error (the decode leg's policy is fail).
func (e *Engine) pull(ctx context.Context, tk *ticket, req *genRequest) pullResult {
	var r pullResult
	switch {
	case req.kv.remotePrefill && req.kv.remote == nil:
		// vLLM: "Got invalid KVTransferParams: … This request will not utilize KVTransfer".
		e.log.Warn("invalid KVTransferParams; computing the prompt locally", "reason", req.kv.invalid)
		r = pullResult{kind: pullDecode, outcome: outcomeRecompute, cached: tk.cached}
	case req.kv.remotePrefill:
		r = e.pullLeased(ctx, tk, req)
	default:
		r = e.pullPeer(ctx, tk, req)
	}
	e.met.pulls.WithLabelValues(r.kind, r.outcome).Inc()
	if r.outcome == outcomeFail {
		return r
	}
	e.met.pulledTokens.WithLabelValues(r.kind).Add(float64(r.tokens))
	e.mu.Lock()
	e.settleLocked(tk, r.tokens, r.cached)
	e.mu.Unlock()
	return r
}

// pullLeased reads a decode leg's missing blocks from the prefill engine's lease.
func (e *Engine) pullLeased(ctx context.Context, tk *ticket, req *genRequest) pullResult {
	rb := req.kv.remote
	bs := e.cfg.BlockSize
	n := len(tk.tokens)
	hit := tk.cached // block-aligned, at most n − 1
	r := pullResult{kind: pullDecode, cached: hit}
	fail := func(err error) pullResult {
		r.err = err
		r.outcome = outcomeRecompute
		if e.cfg.KVLoadFailurePolicy == PolicyFail {
			r.outcome = outcomeFail
		}
		e.log.Warn("kv load failed", "remote_engine_id", rb.engineID, "remote_request_id", rb.requestID,
			"policy", e.cfg.KVLoadFailurePolicy, "err", err)
		return r
	}
	if rb.bad != "" {
		return fail(fmt.Errorf("%w: unusable kv_transfer_params: %s", errPeer, rb.bad))
	}
	count := n - hit
	from := hit / bs
	want := rb.blockIDs[min(from, len(rb.blockIDs)):min(len(rb.blockIDs), (n+bs-1)/bs)]
	if t := e.cfg.KVRecomputeThreshold; t > 0 && count < t {
		// Too little to be worth a transfer: recompute, and free the prefill engine's blocks.
		e.releaseRemote(ctx, rb)
		r.outcome = outcomeRecompute
		return r
	}
	var resp blocksResponse
	err := e.call(ctx, rb.host, rb.port, "/kv/pull",
		pullRequest{Version: sideChannelVersion, EngineID: rb.engineID, RequestID: rb.requestID, BlockIDs: want}, &resp)
	if err != nil {
		return fail(err)
	}
	hashes := local.AppendBlockHashes(nil, tk.tokens, bs, tk.adapter)
	moved, err := checkServed(&resp, rb.engineID, bs, from, tk.tokens, hashes, want)
	if err != nil {
		return fail(err)
	}
	r.tokens = moved
	r.cached = min(hit+moved, n-1)
	r.outcome = outcomeOK
	return r
}

// pullPeer fetches from a remote_kv_source the full blocks past the local hit that it holds.
// A peer that cannot be reached or refuses costs nothing but the recompute.
func (e *Engine) pullPeer(ctx context.Context, tk *ticket, req *genRequest) pullResult {
	src := req.kv.source
	bs := e.cfg.BlockSize
	n := len(tk.tokens)
	hit := tk.cached
	r := pullResult{kind: pullPeer, cached: hit, outcome: outcomeOK}
	from, end := hit/bs, (n-1)/bs // blocks past the hit, up to the last one counted as cached
	if from >= end {
		return r
	}
	hashes := local.AppendBlockHashes(nil, tk.tokens[:end*bs], bs, tk.adapter)
	var resp blocksResponse
	err := e.call(ctx, src.host, src.port, "/kv/lookup", lookupRequest{Version: sideChannelVersion,
		KVRequestID: src.requestID, Adapter: tk.adapter, BlockSize: bs, From: from,
		Tokens: tk.tokens[:end*bs], Hashes: hashes[from:]}, &resp)
	if err == nil {
		// The peer serves a run from block from on; any shorter run is fine.
		if len(resp.Blocks) > end-from {
			err = fmt.Errorf("%w: %d blocks served for %d asked", errPeer, len(resp.Blocks), end-from)
		} else {
			want := make([]uint32, len(resp.Blocks)) // a lookup names no block ids
			r.tokens, err = checkServed(&resp, resp.EngineID, bs, from, tk.tokens, hashes, want)
		}
	}
	if err != nil {
		e.log.Warn("kv peer pull failed; computing the prompt locally", "kv_request_id", src.requestID,
			"remote_host", src.host, "remote_port", src.port, "err", err)
		r.outcome, r.err, r.tokens = outcomeRecompute, err, 0
		return r
	}
	r.cached = hit + r.tokens
	return r
}

// checkServed verifies what a peer served against the prompt: the version, the engine, the block
// size, consecutive positions from block from, the block ids asked for, and each block's tokens
// and (for a full block) its canonical hash. It returns the tokens moved.
func checkServed(resp *blocksResponse, engineID string, bs, from int, tokens []uint32, hashes []uint64, want []uint32) (int, error) {
	switch {
	case resp.Version != sideChannelVersion:
		return 0, fmt.Errorf("%w: side-channel version %d", errPeer, resp.Version)
	case resp.EngineID != engineID:
		return 0, fmt.Errorf("%w: engine %q answered for %q", errPeer, resp.EngineID, engineID)
	case resp.BlockSize != bs:
		return 0, fmt.Errorf("%w: block size %d, ours %d", errPeer, resp.BlockSize, bs)
	case len(resp.Blocks) != len(want):
		return 0, fmt.Errorf("%w: %d blocks served, %d asked", errPeer, len(resp.Blocks), len(want))
	}
	moved := 0
	for i, b := range resp.Blocks {
		p := from + i
		lo, hi := p*bs, min((p+1)*bs, len(tokens))
		switch {
		case b.Position != p || b.ID != want[i]:
			return 0, fmt.Errorf("%w: block %d at position %d, asked %d at %d", errPeer, b.ID, b.Position, want[i], p)
		case lo >= len(tokens) || !slices.Equal(b.Tokens, tokens[lo:hi]):
			return 0, fmt.Errorf("%w: block at position %d holds other tokens than the prompt's", errPeer, p)
		case p < len(hashes) && b.Hash != hashes[p]:
			return 0, fmt.Errorf("%w: block at position %d has hash %#x, the prompt's is %#x", errPeer, p, b.Hash, hashes[p])
		}
		moved += len(b.Tokens)
	}
	return moved, nil
}

// releaseRemote tells a prefill engine that this decode leg will not read its lease, so that it
// frees the blocks now rather than at expiry (vLLM's decode does the same for a request aborted
// before it was scheduled: pull_scheduler.py request_finished). Best effort: a lost message
// leaves the lease to expire.
func (e *Engine) releaseRemote(ctx context.Context, rb *remoteBlocks) {
	if rb == nil || rb.bad != "" {
		return
	}
	var resp blocksResponse
	if err := e.call(ctx, rb.host, rb.port, "/kv/pull",
		pullRequest{Version: sideChannelVersion, EngineID: rb.engineID, RequestID: rb.requestID}, &resp); err != nil {
		e.log.Debug("kv lease release", "remote_request_id", rb.requestID, "err", err)
	}
}

// heartbeat renews the prefill engine's lease while a decode leg waits to be admitted.
func (e *Engine) heartbeat(ctx context.Context, rb *remoteBlocks) {
	var resp map[string]int
	if err := e.call(ctx, rb.host, rb.port, "/kv/heartbeat",
		heartbeatRequest{Version: sideChannelVersion, EngineID: rb.engineID, RequestIDs: []string{rb.requestID}}, &resp); err != nil {
		e.log.Debug("kv lease heartbeat", "remote_request_id", rb.requestID, "err", err)
	}
}

// settleLocked fixes an admitted request's accounting once its pull is known: tokens moved
// from a peer and the cached_tokens to report, the rest prefilled in the steps once the
// transfer's time is over. e.mu is held.
func (e *Engine) settleLocked(tk *ticket, pulled, cached int) {
	tk.cached, tk.pulled = cached, pulled
	tk.uncached = len(tk.tokens) - cached
	e.setPrefillLocked(tk)
	e.chargeLocked(tk, transferTime(pulled, e.cfg.KVTransferTokensPerSec))
	e.kickLocked() // without a wait to serve, the steps may take it now
}

// transferTime is the simulated time to move tokens from a peer.
func transferTime(tokens int, perSec float64) time.Duration {
	if tokens <= 0 || perSec <= 0 {
		return 0
	}
	return time.Duration(float64(tokens) / perSec * float64(time.Second))
}
