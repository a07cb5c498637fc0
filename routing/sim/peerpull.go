package sim

import (
	"time"

	"github.com/prefixmesh/prefixmesh/routing"
)

// Peer pull (routing/POLICIES.md, "Peer pull"), as the daemon's doors run it: the router decides
// the node (routing.Decider.Decide), then, when no remote prefill was planned, asks
// routing.Decider.PlanPeerPull whether that node should fetch a longer run of the prompt from
// another candidate, the source (the picker's planPeerPull in router/requests/prefill.go). The
// request reaches its node naming the source, as a front door's
// kv_transfer_params.remote_kv_source does.
//
// On the node, the pull is the simulated engine's pullPeer (node/simengine/pull.go): once the
// request is admitted (its GPU prefix looked up, its CPU-tier run loaded), it fetches the full
// blocks past that hit which the source holds at that moment, up to the last block vLLM counts
// as cached, at the P/D transfer's ground truth (Config.KVTransferTokensPerSec plus
// Config.KVTransferOverhead); the sequence waits outside the steps meanwhile, then prefills only
// the rest. The source serves its GPU prefix and the CPU-tier run continuing it, as the side
// channel's /kv/lookup does. What the router planned is not what moves: a source that evicted
// the run since (or had not yet computed it: the router's overlay counts a prefill in flight as
// held) serves what it still holds, and the node recomputes the rest. The pulled blocks enter
// the node's cache with the rest of the prompt when its first token is out, as a CPU-tier load's
// do.
//
// The router learns the pull's time only from what it observes: at the request's first token,
// Decider.ObserveTransfer with the tokens it planned and the pull's time as the engine's KV
// connector reports it (vLLM's connector stats time each transfer), the one sample the P/D path
// cannot take without the decode node's queue in it.

// pullPlan is a router's peer-pull decision for one request, carried to its node.
type pullPlan struct {
	source int // fleet position of the source; -1 without a pull
	tokens int // the tokens the router expects to move (routing.PeerPull.Tokens)
	router int
	sec    float64 // the pull's time once it ran, for the router's observation; 0 before
}

// pullStats counts peer pulls over a run (Result.PeerPull*).
type pullStats struct {
	planned, pulled int   // requests the router planned a pull for; that moved any KV
	plannedTokens   int64 // tokens the routers expected to move
	pulledTokens    int64 // tokens moved
	reasons         map[string]int
	decisions       int // PlanPeerPull calls
	holderFaster    int // pulls planned though the source's own predicted TTFT was sooner
	pullTime        time.Duration
	saving          float64 // sum over planned pulls of the predicted LocalTTFT − PullTTFT
}

func (p *pullStats) reason(r string) {
	if p.reasons == nil {
		p.reasons = make(map[string]int)
	}
	p.reasons[r]++
}

// fill sets r's peer-pull fields; promptTokens are the run's admitted prompt tokens.
func (p *pullStats) fill(r *Result, requests int, promptTokens int64) {
	if p.decisions == 0 {
		return
	}
	r.PeerPullReasons = p.reasons
	if requests > 0 {
		r.PeerPullPlannedShare = float64(p.planned) / float64(requests)
		r.PeerPullShare = float64(p.pulled) / float64(requests)
	}
	if promptTokens > 0 {
		r.PeerPullTokenShare = float64(p.pulledTokens) / float64(promptTokens)
	}
	if p.plannedTokens > 0 {
		r.PeerPullDelivered = float64(p.pulledTokens) / float64(p.plannedTokens)
	}
	if p.planned > 0 {
		r.PeerPullSavingMs = 1000 * p.saving / float64(p.planned)
		r.PeerPullHolderFaster = float64(p.holderFaster) / float64(p.planned)
	}
	if p.pulled > 0 {
		r.PeerPullMeanMs = float64(p.pullTime) / float64(time.Millisecond) / float64(p.pulled)
	}
}

// peerPull is the router's peer-pull decision for the request it has just decided (over
// rt.dinfos): routing.Decider.PlanPeerPull, after Decide and only without a remote prefill, the
// daemon's order. With a pull the estimate becomes the pulled run, as the picker reports it.
func (rt *router) peerPull(s *Sim, dr *routing.DecideRequest) pullPlan {
	pp := rt.dec.PlanPeerPull(dr, rt.dinfos, &rt.choice)
	st := &s.col.pull
	st.decisions++
	st.reason(pp.Reason)
	if pp.Source < 0 {
		return pullPlan{source: -1}
	}
	st.planned++
	st.plannedTokens += int64(pp.Tokens)
	st.saving += pp.LocalTTFT - pp.PullTTFT
	if pp.HolderTTFT < pp.PullTTFT {
		st.holderFaster++
	}
	rt.choice.MatchedTokens = pp.MatchedTokens
	return pullPlan{source: rt.didx[pp.Source], tokens: pp.Tokens, router: rt.idx}
}

// admittedPull is Sim.admitted for a request that also pulled tokens from a peer: the estimate
// is compared with what the engine reports cached (its own hit and the pull, as vLLM counts a
// connector's tokens), while the hit ratio stays the node's own cache.
func (s *Sim) admittedPull(r, matched, loaded, pulled int) {
	s.admitted(r, matched, loaded+pulled)
	s.col.matchedTokens -= int64(pulled)
	s.col.loadedTokens -= int64(pulled)
}

// transferTime is the ground truth of moving tokens' KV between two nodes.
func (s *Sim) transferTime(tokens int) time.Duration {
	t := s.cfg.KVTransferOverhead
	if tokens > 0 {
		t += time.Duration(float64(tokens) / s.cfg.KVTransferTokensPerSec * float64(time.Second))
	}
	return t
}

// servable is the run of tokens a source node serves a peer at this moment: its GPU prefix and
// the CPU-tier run continuing it.
func (n *node) servable(s *Sim, tokens []uint32) int {
	run := n.tree.PeekMatchedTokens(tokens, s.cfg.BlockSize, 0)
	if n.cpu != nil {
		run += n.cpu.Peek(tokens, 0, run)
	}
	return run
}

// pullPeer runs the pull planned for request r, admitted on n with hit tokens of its own (GPU
// prefix and CPU-tier load): the full blocks past hit that the source holds now, up to the last
// block counted as cached. It returns the tokens moved and how long the move takes (0, 0 without
// a plan or when the source holds nothing past hit).
func (n *node) pullPeer(s *Sim, r, hit int) (int, time.Duration) {
	p, ok := n.pulls[r]
	if !ok {
		return 0, 0
	}
	toks := s.trace.Requests[r].Tokens
	bs := s.cfg.BlockSize
	end := (len(toks) - 1) / bs * bs
	run := min(s.nodes[p.source].servable(s, toks), end)
	if run <= hit {
		delete(n.pulls, r) // nothing to move: the node recomputes, and the router learns nothing
		return 0, 0
	}
	moved := run - hit
	t := s.transferTime(moved)
	p.sec = t.Seconds()
	n.pulls[r] = p
	st := &s.col.pull
	st.pulled++
	st.pulledTokens += int64(moved)
	st.pullTime += t
	return moved, t
}

// observePull: request r's first token is out on n; a pull it made reaches its router's transfer
// fit (the planned tokens, the time the engine reports for the pull).
func (n *node) observePull(s *Sim, r int) {
	p, ok := n.pulls[r]
	if !ok {
		return
	}
	delete(n.pulls, r)
	if p.sec > 0 {
		observeTransfer(s.routers[p.router].dec, p.tokens, p.sec)
	}
}

// observeTransfer teaches d one transfer of tokens that took sec seconds, with no decode wait in
// it (the engine timed the pull itself).
func observeTransfer(d *routing.Decider, tokens int, sec float64) {
	d.ObserveTransfer(&routing.PrefillPlan{Prefill: -1, Transfer: tokens}, sec)
}
