package routing

import (
	"math"

	"github.com/prefixmesh/prefixmesh/local"
)

// Peer pull (POLICIES.md, "Peer pull"). The policy chose node C for a request; another candidate
// H, the holder, may hold a longer run of the prompt than C: typically H is overloaded (beyond
// the load guard, at the in-flight cap, or behind a queue that outweighs its cache), so the
// policy passed it over. C can fetch that run from H before it
// prefills the rest, as llm-d's P2P sidecar has an engine do (llm-d/llm-d-router,
// pkg/sidecar/proxy/connector_p2p.go: kv_transfer_params.remote_kv_source) and the simulated
// engine serves (node/simengine/pull.go, pullPeer). The router plans the pull when C's predicted
// first token with it,
//
//	C's queue + transfer(tokens H holds past C's run, TransferFit) + C's prefill of the rest,
//
// comes sooner than C's without it: the TTFT comparison of PlanPrefill, with the same learned
// transfer fit. The pull is onto C, the policy's choice, never a new choice of node: the policy
// has already weighed H serving the request itself (its load guard and miss penalty), and the
// pull only shortens C's first token. Under that cost model the holder with the longest run is
// the best source (every token pulled instead of prefilled saves the same time, or none does),
// so one holder is evaluated.

// What a holder can serve. The peer answers from its GPU prefix and then from the CPU tier that
// continues it (node/simengine/sidechannel.go, /kv/lookup; vLLM's p2p secondary tier looks blocks
// up in the peer's CPU offload store, vllm/v1/kv_offload/tiering/p2p/manager.py): a run on disk,
// local storage or a shared store is not served by the peer. TierTokens counts a run's tokens per
// tier, not their order, so H's CPU tokens count only when its whole lower-tier run is on CPU;
// otherwise a disk block could end the served run before some of them, and H counts its GPU
// prefix alone (an under-estimate: the engine fetches whatever more it finds).

// PeerPull is the peer-pull decision for a request whose node is chosen.
type PeerPull struct {
	// Source is the holder to pull from, an index into the candidates (PeerPullInput.Nodes, the
	// nodes given to Decide); -1 for no pull.
	Source int
	// Tokens is the number of prompt tokens the chosen node fetches from Source (0 without a
	// pull): the source's run past the chosen node's own, both counted as the engine counts
	// cached tokens (whole blocks, at most the prompt less one token, local.EngineCachedTokens).
	Tokens int
	// MatchedTokens is what the chosen node will report as cached: its own run plus the pull.
	MatchedTokens int
	// LocalTTFT and PullTTFT are the chosen node's predicted first token without and with the
	// pull from the best holder, in seconds (PullTTFT +Inf when no candidate holds more).
	LocalTTFT, PullTTFT float64
	// HolderTTFT is the best holder's own predicted first token for the whole request (+Inf
	// without a holder): for the record, not decided on.
	HolderTTFT float64
	Reason     string
}

// Reasons of a PeerPull.
const (
	PeerPullDisabled   = "disabled"
	PeerPullNoHolder   = "no-longer-holder" // no other candidate holds more of the prompt
	PeerPullLocalFast  = "recompute-faster"
	PeerPullPullFaster = "pull-faster"
)

// PeerPullInput is what PlanPeerPull weighs: the candidates as the policy saw them (load,
// learned fits), each one's match, the chosen one among them and the transfer fit.
type PeerPullInput struct {
	PromptTokens int
	BlockSize    int // the chosen node's
	// Nodes are the candidates; Chosen is the node the policy chose among them.
	Nodes  []NodeInfo
	Chosen int
	// GPU[i] is Nodes[i]'s GPU prefix in tokens and Lower[i] the lower-tier run continuing it
	// (its GPU entry is ignored; nil for no lower tiers).
	GPU      []int
	Lower    []TierTokens
	Transfer TransferFit
}

// match is node i's TierTokens, the GPU entry filled.
func (in *PeerPullInput) match(i int) TierTokens {
	var m TierTokens
	if i < len(in.Lower) {
		m = in.Lower[i]
	}
	m[local.TierGPU] = in.GPU[i]
	return m
}

// servable is the run of the prompt a holder with match m serves a peer: its GPU prefix, and its
// lower-tier run when all of it is on CPU.
func servable(m *TierTokens) int {
	if m.Lower() == m[local.TierCPU] {
		return m[local.TierGPU] + m[local.TierCPU]
	}
	return m[local.TierGPU]
}

// PlanPeerPull decides whether the chosen node pulls the prompt's prefix from another candidate.
// It allocates nothing.
func PlanPeerPull(in *PeerPullInput, cfg *PolicyConfig) PeerPull {
	out := PeerPull{Source: -1, PullTTFT: math.Inf(1), HolderTTFT: math.Inf(1)}
	c := &in.Nodes[in.Chosen]
	cm := in.match(in.Chosen)
	// Without the pull: PlanPrefill's local prediction (the lower tiers credited at their load).
	credited, load := tierCost(c, &cm, cfg)
	uncached := max(in.PromptTokens-cm[local.TierGPU]-credited, 0)
	tierSec := load * c.TTFT.PrefillScale() / nominalRate(c, cfg)
	out.LocalTTFT = PredictTTFT(c, uncached, cfg) + tierSec
	bs := max(in.BlockSize, 1)
	have := local.EngineCachedTokens(cm.Total(), in.PromptTokens, bs)
	out.MatchedTokens = have
	if !cfg.PeerPull {
		out.Reason = PeerPullDisabled
		return out
	}
	// The best holder: the longest servable run past C's, ties to the least loaded, then the
	// lowest id (so replicas with the same view agree whatever the candidates' order).
	best, run := -1, have
	for i := range in.Nodes {
		h := &in.Nodes[i]
		if i == in.Chosen || h.Cold || blockSizeOf(h) != blockSizeOf(c) {
			continue // a cold summary may over-state; another block size cannot be pulled
		}
		m := in.match(i)
		r := local.EngineCachedTokens(servable(&m), in.PromptTokens, bs)
		if r < run || r == have {
			continue
		}
		if r == run && best >= 0 {
			l, bl := Load(h, cfg.LoadAgeHalfLife), Load(&in.Nodes[best], cfg.LoadAgeHalfLife)
			if l > bl || l == bl && h.ID >= in.Nodes[best].ID {
				continue
			}
		}
		best, run = i, r
	}
	if best < 0 {
		out.Reason = PeerPullNoHolder
		return out
	}
	// With the pull: C's queue, the transfer, then C prefills what neither it nor the pull
	// covers. The pulled tokens lie past C's whole run, so they leave C's uncached work exactly.
	pulled := run - have
	out.PullTTFT = PredictTTFT(c, max(uncached-pulled, 0), cfg) + tierSec + in.Transfer.Seconds(pulled)
	h := &in.Nodes[best]
	hm := in.match(best)
	hc, hl := tierCost(h, &hm, cfg)
	out.HolderTTFT = PredictTTFT(h, max(in.PromptTokens-hm[local.TierGPU]-hc, 0), cfg) +
		hl*h.TTFT.PrefillScale()/nominalRate(h, cfg)
	if !(out.PullTTFT < out.LocalTTFT) {
		out.Reason = PeerPullLocalFast
		return out
	}
	out.Source, out.Tokens, out.MatchedTokens, out.Reason = best, pulled, run, PeerPullPullFaster
	return out
}
