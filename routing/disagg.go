package routing

import (
	"fmt"
	"math"

	"github.com/prefixmesh/prefixmesh/local"
)

// Prefill/decode disaggregation (POLICIES.md, "Disaggregation"). Decode first: the decode node D
// is chosen as any request's node (cache credit, load, TTFT). Then the request is prefilled
// elsewhere only if that reaches the first token sooner: the best prefill node P's predicted TTFT
// for the tokens it does not hold, plus moving the KV D lacks from P to D, against D prefilling
// them itself behind its own queue. The transfer's cost is learned from what the router observes
// (TransferFit), never configured into the decision beyond its prior.

// DisaggMode is when a router sends a request's prefill to a prefill node.
type DisaggMode uint8

const (
	// DisaggAuto disaggregates when the predicted TTFT says so.
	DisaggAuto DisaggMode = iota
	// DisaggAlways disaggregates every request with a prefill node available and more than one
	// block uncached on the decode node.
	DisaggAlways
	// DisaggNever prefills on the decode node (aggregated serving).
	DisaggNever
)

// ParseDisaggMode reads a --disaggregate value.
func ParseDisaggMode(s string) (DisaggMode, error) {
	switch s {
	case "auto":
		return DisaggAuto, nil
	case "always":
		return DisaggAlways, nil
	case "never":
		return DisaggNever, nil
	}
	return 0, fmt.Errorf("disaggregate mode %q: want auto, always or never: %w", s, ErrInvalid)
}

func (m DisaggMode) String() string {
	return [...]string{"auto", "always", "never"}[m]
}

// TransferFit is what a router has learned of moving KV between nodes: a transfer of n tokens'
// KV takes Overhead + n × SecPerToken seconds. The zero value is the prior (DefaultTransfer).
type TransferFit struct {
	Overhead    float64
	SecPerToken float64
	Samples     float64
}

// DefaultTransfer is the prior before any transfer is observed: 5 ms to set a transfer up and
// 128 KiB of KV per token (an 8B model with GQA in bf16: 32 layers × 8 KV heads × 128 × 2 × 2
// bytes) at 25 GB/s, half an RDMA NIC's 400 Gb/s: ≈5.2 µs per token, against ≈40 µs per token
// to prefill it (the tier figures of POLICIES.md, "Tiers").
var DefaultTransfer = TransferFit{Overhead: 0.005, SecPerToken: 128 << 10 / 25e9}

func (f TransferFit) orPrior() TransferFit {
	if f.Samples > 0 {
		return f
	}
	return DefaultTransfer
}

// Seconds is the predicted time to move n tokens' KV.
func (f TransferFit) Seconds(n int) float64 {
	if n <= 0 {
		return 0
	}
	p := f.orPrior()
	return p.Overhead + p.SecPerToken*float64(n)
}

// transferMemory and transferPrior: a forgetting mean over about 256 transfers, shrunk toward the
// prior with the weight of 16.
const (
	transferMemory = 256
	transferPrior  = 16.0
)

// TransferLearner learns a TransferFit from observed transfers: the time between the prefill
// leg's answer and the decode leg's first byte, less the decode node's predicted wait
// (PrefillPlan.DecodeWait: its queue would otherwise be learned as transfer time, and a busy
// decode pool would teach that moving KV is slow), for the tokens the decode node had to pull. The
// fixed part is kept at the prior's; the per-token cost is the forgetting mean of (time −
// overhead) / tokens, shrunk toward the prior.
type TransferLearner struct {
	sum, n float64
}

// Observe adds one transfer of tokens taking sec seconds; garbage (negative, over a minute, no
// tokens) is ignored.
func (l *TransferLearner) Observe(tokens int, sec float64) {
	if tokens <= 0 || !(sec >= 0) || sec > ttftMaxSec {
		return
	}
	keep := 1 - 1.0/transferMemory
	per := math.Max(sec-DefaultTransfer.Overhead, 0) / float64(tokens)
	l.sum = keep*l.sum + per
	l.n = keep*l.n + 1
}

// Fit is the learned fit (the prior before any observation).
func (l *TransferLearner) Fit() TransferFit {
	if l.n == 0 {
		return DefaultTransfer
	}
	per := (l.sum + transferPrior*DefaultTransfer.SecPerToken) / (l.n + transferPrior)
	return TransferFit{Overhead: DefaultTransfer.Overhead, SecPerToken: per, Samples: l.n}
}

// PrefillPlan is the disaggregation decision for a request whose decode node is chosen.
type PrefillPlan struct {
	// Prefill is the index of the prefill node among the candidates, -1 to prefill on the
	// decode node.
	Prefill int
	// LocalTTFT and RemoteTTFT are the predictions compared, in seconds (RemoteTTFT +Inf when
	// there was no prefill candidate). LocalStall is what a local prefill adds to the waits of
	// the requests the decode node holds (its running sequences' steps, its queue), RemoteStall
	// what the remote one adds to those the prefill node holds, each weighed by
	// PolicyConfig.DecodeStall and added to its side.
	LocalTTFT, RemoteTTFT, LocalStall, RemoteStall float64
	// Transfer is the tokens the decode node must pull (prompt − what it holds).
	Transfer int
	// DecodeWait is the decode node's predicted wait left when the prefill leg answers (its
	// queue and the one token it computes, PredictTTFT(D, 1), less the prefill's time): part of
	// RemoteTTFT, and what a door's observed transfer time holds beside the transfer
	// (ObserveTransfer).
	DecodeWait float64
	Reason     string
}

// Reasons of a PrefillPlan.
const (
	PrefillLocalNever     = "never"
	PrefillLocalNoNode    = "no-prefill-node"
	PrefillLocalCached    = "decode-node-cached"
	PrefillLocalFaster    = "local-faster"
	PrefillRemoteFaster   = "remote-faster"
	PrefillRemoteAlways   = "always"
	PrefillRemoteLLMD     = "llm-d-uncached"
	PrefillLocalLLMD      = "llm-d-cached"
	PrefillLocalDynamo    = "dynamo-bypass"
	PrefillRemoteDynamo   = "dynamo-disaggregate"
	prefillNoPrefillNodes = -1
)

// PrefillInput is what PlanPrefill weighs: the prompt, the decode node D with its matched tokens
// (GPU and lower tiers), and the prefill candidates with theirs.
type PrefillInput struct {
	PromptTokens int
	BlockSize    int
	Decode       *NodeInfo
	DecodeMatch  TierTokens
	Prefill      []NodeInfo
	PrefillMatch []TierTokens
	Transfer     TransferFit
}

// PlanPrefill decides where the request's prefill runs (mode auto, always or never): locally on
// the decode node, or on the prefill candidate with the earliest predicted first token once the
// KV the decode node lacks has moved to it.
func PlanPrefill(in *PrefillInput, mode DisaggMode, cfg *PolicyConfig) PrefillPlan {
	plan := PrefillPlan{Prefill: prefillNoPrefillNodes, RemoteTTFT: math.Inf(1)}
	credited, load := tierCost(in.Decode, &in.DecodeMatch, cfg)
	held := in.DecodeMatch[0] + credited
	uncached := max(in.PromptTokens-held, 0)
	plan.Transfer = uncached
	plan.LocalTTFT = PredictTTFT(in.Decode, uncached, cfg) + load*in.Decode.TTFT.PrefillScale()/nominalRate(in.Decode, cfg)
	// What the local prefill costs the decode node's running sequences (PolicyConfig.DecodeStall).
	plan.LocalStall = cfg.DecodeStall * float64(seqsOn(in.Decode)) * float64(uncached) * in.Decode.TTFT.PrefillScale() / nominalRate(in.Decode, cfg)
	switch {
	case mode == DisaggNever:
		plan.Reason = PrefillLocalNever
		return plan
	case len(in.Prefill) == 0:
		plan.Reason = PrefillLocalNoNode
		return plan
	case uncached <= max(in.BlockSize, 1):
		plan.Reason = PrefillLocalCached
		return plan
	}
	best := -1
	// The decode leg reaches D when the prefill leg answers, waits behind what D has queued
	// then (FCFS, as vLLM's scheduler takes waiting requests), pulls the KV and computes the
	// last token: max(prefill, D's wait) + transfer.
	wait := PredictTTFT(in.Decode, 1, cfg)
	for i := range in.Prefill {
		p := &in.Prefill[i]
		var m TierTokens
		if i < len(in.PrefillMatch) {
			m = in.PrefillMatch[i]
		}
		pc, pl := tierCost(p, &m, cfg)
		need := max(in.PromptTokens-m[0]-pc, 0)
		pt := PredictTTFT(p, need, cfg) + pl*p.TTFT.PrefillScale()/nominalRate(p, cfg)
		t := max(pt, wait) + in.Transfer.Seconds(uncached)
		// The prefill delays the requests P holds as a local one delays D's (LocalStall).
		stall := cfg.DecodeStall * float64(seqsOn(p)) * float64(need) * p.TTFT.PrefillScale() / nominalRate(p, cfg)
		if best < 0 || t+stall < plan.RemoteTTFT+plan.RemoteStall {
			best, plan.RemoteTTFT, plan.RemoteStall = i, t, stall
			plan.DecodeWait = max(wait-pt, 0)
		}
	}
	if mode == DisaggAlways || plan.RemoteTTFT+plan.RemoteStall < plan.LocalTTFT+plan.LocalStall {
		plan.Prefill = best
		plan.Reason = PrefillRemoteFaster
		if mode == DisaggAlways {
			plan.Reason = PrefillRemoteAlways
		}
		return plan
	}
	plan.Reason = PrefillLocalFaster
	return plan
}

// PlanPrefillLLMD is llm-d's prefix-based P/D decider (llm-d/llm-d-inference-scheduler,
// plugins/scheduling/profilehandler/disagg/prefix_based_pd_decider.go): disaggregate iff the
// prompt's tokens not cached on the chosen decode node, counted on the GPU only (unweighted), are
// at least nonCached; nonCached 0 disables P/D. The prefill node is the least loaded candidate
// (llm-d's prefill profile scores load), the first on ties.
func PlanPrefillLLMD(in *PrefillInput, nonCached int) PrefillPlan {
	plan := PrefillPlan{Prefill: prefillNoPrefillNodes, Reason: PrefillLocalLLMD}
	uncached := max(in.PromptTokens-in.DecodeMatch[0], 0)
	plan.Transfer = uncached
	if nonCached <= 0 || len(in.Prefill) == 0 || in.PromptTokens < nonCached || uncached < nonCached {
		return plan
	}
	plan.Prefill, plan.Reason = leastQueued(in.Prefill), PrefillRemoteLLMD
	return plan
}

// PlanPrefillDynamo is Dynamo's conditional disaggregation, isl_bounding (ai-dynamo/dynamo,
// lib/kv-router/src/conditional_disagg.rs): with eff = prompt − min(cached on the decode node,
// prompt), the cached count weighted by tier as Dynamo credits it (weights), stay local iff
// eff < 2048 and eff/prompt < 0.7. The prefill node is the least loaded candidate.
func PlanPrefillDynamo(in *PrefillInput, weights [local.NumTiers]float64) PrefillPlan {
	plan := PrefillPlan{Prefill: prefillNoPrefillNodes, Reason: PrefillLocalDynamo}
	cached := 0.0
	for t, n := range in.DecodeMatch {
		cached += weights[t] * float64(n)
	}
	eff := float64(in.PromptTokens) - math.Min(cached, float64(in.PromptTokens))
	plan.Transfer = max(in.PromptTokens-in.DecodeMatch[0], 0)
	if len(in.Prefill) == 0 || eff < 2048 && eff/math.Max(float64(in.PromptTokens), 1) < 0.7 {
		return plan
	}
	plan.Prefill, plan.Reason = leastQueued(in.Prefill), PrefillRemoteDynamo
	return plan
}

// leastQueued is the candidate with the least queued prefill work (report or own count).
func leastQueued(nodes []NodeInfo) int {
	best, bestQ := 0, math.Inf(1)
	for i := range nodes {
		q := float64(max(nodes[i].QueuedPrefillTokens, nodes[i].InFlightPrefillTokens)) / nominalRate(&nodes[i], &PolicyConfig{DefaultPrefillTokensPerSec: 1})
		if q < bestQ {
			best, bestQ = i, q
		}
	}
	return best
}
