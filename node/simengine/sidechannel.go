package simengine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/prefixmesh/prefixmesh/internal/openai"
	"github.com/prefixmesh/prefixmesh/local"
)

// The side channel is where other engines pull KV from this one: a second HTTP listener of the
// engine's own (Config.KVSideChannel), as vLLM's NixlConnector listens on a side channel of its
// own (VLLM_NIXL_SIDE_CHANNEL_HOST/PORT) beside the OpenAI API, and what remote_host and
// remote_port name. It stands in for the NIXL handshake and RDMA read, which move KV between
// GPUs without either engine's scheduler: here the peer answers with each block's tokens and
// canonical hash (local.ChainHash), which is what a simulated block holds, so the puller can
// check them against its own prompt and insert the blocks as its own. Every body is JSON with a
// version first; a peer refuses a version it does not know.
//
//	POST /kv/pull       a decode leg reads a prefill leg's leased blocks; the lease ends
//	POST /kv/heartbeat  a waiting decode leg renews the leases it will pull
//	POST /kv/lookup     a peer pull: the blocks of a prompt this engine holds, GPU or CPU tier
const sideChannelVersion = 1

// sideChannelTimeout bounds one side-channel call: a peer on loopback or a LAN answers in
// milliseconds, so a peer that accepted the connection and hangs is treated as gone well before
// a client would give up on the request.
const sideChannelTimeout = 5 * time.Second

// sideChannelShutdown bounds Close's wait for side-channel calls in flight.
const sideChannelShutdown = 5 * time.Second

// pullRequest reads leased blocks. BlockIDs may be empty: the decode leg found everything it
// needed locally, or gave up, and only tells the peer to free its blocks (vLLM's D sends the
// notification with no blocks read for the same reason, pull_scheduler.py request_finished).
type pullRequest struct {
	Version   int      `json:"version"`
	EngineID  string   `json:"engine_id"`  // the engine the decode leg expects at this address
	RequestID string   `json:"request_id"` // remote_request_id
	BlockIDs  []uint32 `json:"block_ids"`
}

// heartbeatRequest renews leases.
type heartbeatRequest struct {
	Version    int      `json:"version"`
	EngineID   string   `json:"engine_id"`
	RequestIDs []string `json:"request_ids"`
}

// lookupRequest asks a peer for a prompt's blocks from block From on: Tokens is the prompt up to
// the last block wanted, Hashes the puller's canonical hashes of blocks From… (the peer checks
// them against its own hashing, so engines with another block size or hash seed refuse rather
// than serve KV that is not the prompt's).
type lookupRequest struct {
	Version     int      `json:"version"`
	KVRequestID string   `json:"kv_request_id"`
	Adapter     uint64   `json:"adapter"`
	BlockSize   int      `json:"block_size"`
	From        int      `json:"from"`
	Tokens      []uint32 `json:"tokens"`
	Hashes      []uint64 `json:"hashes"`
}

// servedBlock is one block a peer serves: its place in the prompt, its tokens (fewer than a
// block for a prompt's partial last block, which has no hash), and the tier it was read from.
type servedBlock struct {
	ID       uint32   `json:"id"`
	Position int      `json:"position"`
	Hash     uint64   `json:"hash,omitempty"`
	Tier     string   `json:"tier,omitempty"`
	Tokens   []uint32 `json:"tokens"`
}

// blocksResponse answers a pull or a lookup.
type blocksResponse struct {
	Version   int           `json:"version"`
	EngineID  string        `json:"engine_id"`
	BlockSize int           `json:"block_size"`
	Blocks    []servedBlock `json:"blocks"`
}

// Side-channel refusals, as OpenAI-shaped errors with these codes.
const (
	codeLeaseNotFound  = "kv_lease_not_found" // 404: unknown, already pulled or expired
	codeEngineMismatch = "kv_engine_mismatch" // 409: another engine listens at that address
	codeHashMismatch   = "kv_hash_mismatch"   // 409: block size or hashing differ
	codeBlockNotLeased = "kv_block_not_leased"
)

// sideHandler serves the side channel.
func (e *Engine) sideHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /kv/pull", e.servePull)
	mux.HandleFunc("POST /kv/heartbeat", e.serveHeartbeat)
	mux.HandleFunc("POST /kv/lookup", e.serveLookup)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &openai.Error{Status: http.StatusNotFound, Code: "not_found",
			Message: fmt.Sprintf("no side-channel route for %s %s", r.Method, r.URL.Path)})
	})
	return mux
}

// readSide reads and decodes a side-channel body of a known version.
func (e *Engine) readSide(w http.ResponseWriter, r *http.Request, v any, version func() int) error {
	body, err := e.readBody(w, r)
	if err != nil {
		return err
	}
	if err := openai.Decode(body, v); err != nil {
		return err
	}
	if got := version(); got != sideChannelVersion {
		return openai.Invalid("version", "side-channel version %d: this engine speaks %d", got, sideChannelVersion)
	}
	return nil
}

func (e *Engine) checkEngine(id string) error {
	if id != e.engineID {
		return &openai.Error{Status: http.StatusConflict, Code: codeEngineMismatch, Param: "engine_id",
			Message: fmt.Sprintf("engine %q listens here, not %q", e.engineID, id)}
	}
	return nil
}

func (e *Engine) servePull(w http.ResponseWriter, r *http.Request) {
	var req pullRequest
	if err := e.readSide(w, r, &req, func() int { return req.Version }); err != nil {
		writeError(w, err)
		return
	}
	resp, err := e.pullLease(req)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

// pullLease serves a pull from a lease and ends the lease. Block ids not in the lease are
// refused and the lease kept, so a confused puller cannot free another request's blocks.
func (e *Engine) pullLease(req pullRequest) (*blocksResponse, error) {
	if err := e.checkEngine(req.EngineID); err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	l, ok := e.leases[req.RequestID]
	if ok && !e.now().Before(l.expires) {
		e.releaseLeaseLocked(l)
		e.met.leasesExpired.Inc()
		ok = false
	}
	if !ok {
		return nil, &openai.Error{Status: http.StatusNotFound, Code: codeLeaseNotFound, Param: "request_id",
			Message: fmt.Sprintf("no lease for request %q: unknown, already pulled or expired", req.RequestID)}
	}
	bs := e.cfg.BlockSize
	hashes := local.AppendBlockHashes(nil, l.tokens, bs, l.adapter)
	resp := &blocksResponse{Version: sideChannelVersion, EngineID: e.engineID, BlockSize: bs,
		Blocks: make([]servedBlock, 0, len(req.BlockIDs))}
	for _, id := range req.BlockIDs {
		p := slices.Index(l.blocks, id)
		if p < 0 {
			return nil, &openai.Error{Status: http.StatusBadRequest, Code: codeBlockNotLeased, Param: "block_ids",
				Message: fmt.Sprintf("block %d is not one of request %q's %d leased blocks", id, req.RequestID, len(l.blocks))}
		}
		b := servedBlock{ID: id, Position: p, Tier: "GPU", Tokens: l.tokens[p*bs : min((p+1)*bs, len(l.tokens))]}
		if p < len(hashes) {
			b.Hash = hashes[p]
		}
		resp.Blocks = append(resp.Blocks, b)
	}
	e.releaseLeaseLocked(l)
	e.met.servedBlocks.WithLabelValues(pullDecode).Add(float64(len(resp.Blocks)))
	return resp, nil
}

func (e *Engine) serveHeartbeat(w http.ResponseWriter, r *http.Request) {
	var req heartbeatRequest
	if err := e.readSide(w, r, &req, func() int { return req.Version }); err != nil {
		writeError(w, err)
		return
	}
	if err := e.checkEngine(req.EngineID); err != nil {
		writeError(w, err)
		return
	}
	e.mu.Lock()
	n := e.renewLeasesLocked(req.RequestIDs)
	e.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]int{"version": sideChannelVersion, "renewed": n})
}

func (e *Engine) serveLookup(w http.ResponseWriter, r *http.Request) {
	var req lookupRequest
	if err := e.readSide(w, r, &req, func() int { return req.Version }); err != nil {
		writeError(w, err)
		return
	}
	resp, err := e.lookupBlocks(req)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

// lookupBlocks answers a peer pull from this engine's cache: of the blocks asked for, the run
// it holds, first on the GPU (the tree's prefix), then in the CPU tier continuing it. Nothing
// is pinned: the blocks' contents are copied under the engine's lock, which is the whole read.
func (e *Engine) lookupBlocks(req lookupRequest) (*blocksResponse, error) {
	bs := e.cfg.BlockSize
	switch {
	case req.BlockSize != bs:
		return nil, &openai.Error{Status: http.StatusConflict, Code: codeHashMismatch, Param: "block_size",
			Message: fmt.Sprintf("block size %d, this engine's is %d", req.BlockSize, bs)}
	case req.From < 0 || len(req.Tokens)%bs != 0 || req.From+len(req.Hashes) != len(req.Tokens)/bs:
		return nil, openai.Invalid("hashes", "from %d and %d hashes do not cover the %d tokens' %d blocks",
			req.From, len(req.Hashes), len(req.Tokens), len(req.Tokens)/bs)
	}
	hashes := local.AppendBlockHashes(nil, req.Tokens, bs, req.Adapter)
	if !slices.Equal(hashes[req.From:], req.Hashes) {
		return nil, &openai.Error{Status: http.StatusConflict, Code: codeHashMismatch, Param: "hashes",
			Message: "the prompt's block hashes differ from this engine's: another hash seed or tokenizer"}
	}
	e.mu.Lock()
	gpu, cpu := e.peekTiersLocked(req.Tokens, req.Adapter)
	e.mu.Unlock()
	gpu = gpu / bs * bs // a sub-block match cannot be served
	resp := &blocksResponse{Version: sideChannelVersion, EngineID: e.engineID, BlockSize: bs, Blocks: []servedBlock{}}
	for p := req.From; p < (gpu+cpu)/bs; p++ {
		tier := "GPU"
		if p*bs >= gpu {
			tier = "CPU"
		}
		resp.Blocks = append(resp.Blocks, servedBlock{Position: p, Hash: hashes[p], Tier: tier, Tokens: req.Tokens[p*bs : (p+1)*bs]})
	}
	e.met.servedBlocks.WithLabelValues(pullPeer).Add(float64(len(resp.Blocks)))
	return resp, nil
}

// serveSideChannel serves the side channel on lis (Config.KVSideChannel, bound by Start) until
// Close. e.mu is held.
func (e *Engine) serveSideChannel(lis net.Listener) {
	host, port, _ := net.SplitHostPort(lis.Addr().String())
	if e.cfg.KVSideChannelHost != "" {
		host = e.cfg.KVSideChannelHost
	}
	e.sideHost = host
	e.sidePort, _ = strconv.Atoi(port)
	e.sideLis = lis
	e.sideSrv = &http.Server{Handler: e.sideHandler(), ReadHeaderTimeout: sideChannelTimeout}
	e.bg.Add(1)
	go func() {
		defer e.bg.Done()
		if err := e.sideSrv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			e.log.Error("kv side channel", "err", err)
		}
	}()
}

// KVSideChannelAddr is the side channel's advertised host:port ("" without a KV connector).
func (e *Engine) KVSideChannelAddr() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.sideLis == nil {
		return ""
	}
	return net.JoinHostPort(e.sideHost, strconv.Itoa(e.sidePort))
}

// errPeer wraps every failed side-channel call: the peer is gone, refused, or answered
// something that is not the prompt's KV.
var errPeer = errors.New("kv peer")

// call posts a side-channel request to host:port and decodes the answer into out.
func (e *Engine) call(ctx context.Context, host string, port int, path string, in, out any) error {
	ctx, cancel := context.WithTimeout(ctx, sideChannelTimeout)
	defer cancel()
	body, err := json.Marshal(in)
	if err != nil {
		return fmt.Errorf("%w: encode: %v", errPeer, err)
	}
	url := "http://" + net.JoinHostPort(host, strconv.Itoa(port)) + path
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("%w: %v", errPeer, err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := e.kvClient.Do(req)
	if err != nil {
		return fmt.Errorf("%w: %v", errPeer, err)
	}
	defer resp.Body.Close()
	// A peer answers at most a prompt's blocks, which a request body of MaxBodyBytes carries.
	b, err := io.ReadAll(io.LimitReader(resp.Body, 2*e.cfg.MaxBodyBytes+1))
	switch {
	case err != nil:
		return fmt.Errorf("%w: read %s: %v", errPeer, path, err)
	case int64(len(b)) > 2*e.cfg.MaxBodyBytes:
		return fmt.Errorf("%w: %s answer over %d bytes", errPeer, path, 2*e.cfg.MaxBodyBytes)
	case resp.StatusCode != http.StatusOK:
		return fmt.Errorf("%w: %s: %d %s", errPeer, path, resp.StatusCode, bytes.TrimSpace(b))
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("%w: %s answer: %v", errPeer, path, err)
	}
	return nil
}
