package routing

import (
	"math"
	"time"

	"github.com/prefixmesh/prefixmesh/local"
)

// llmdScore restates llm-d's inference scheduler as its default scheduling profile for precise
// prefix-cache routing configures it (llm-d/llm-d-inference-scheduler
// deploy/config/epp-precise-prefix-cache-config.yaml @95f76e6): the weighted sum of three scorers,
// each in [0, 1], highest wins (max-score-picker).
//
//   - precise-prefix-cache-scorer (weight LLMDPrefixWeight, 2): each node's longest run of the
//     prompt's blocks from the first, a block counting the weight of the tier that holds it
//     (LLMDTierWeights: gpu 1.0, cpu 0.8, unlisted media 1.0; llm-d/llm-d-kv-cache
//     pkg/kvcache/kvblock_scorer.go @24d82ea, LongestPrefixScorer, and pkg/kvcache/backend.go),
//     then min-max normalised over the nodes that matched the first block; a node that did not
//     scores 0, and when every matched node scores the same they all score 1
//     (pkg/plugins/scorer/utils.go @2202f3c, indexedScoresToNormalizedScoredPods).
//   - kv-cache-utilization-scorer (LLMDKVCacheWeight, 1): 1 − KV cache usage
//     (kubernetes-sigs/gateway-api-inference-extension
//     pkg/epp/scheduling/framework/plugins/scorer/kvcache_utilization.go @62d1479), fed
//     (CapacityBlocks − FreeBlocks) / CapacityBlocks, and 0 usage when the capacity is unknown.
//   - queue-scorer (LLMDQueueWeight, 1): (max waiting − waiting) / (max waiting − min waiting)
//     over the candidates, 1 for all when equal (queue.go @c729d43), fed NodeInfo.Waiting, the
//     node's reported vllm:num_requests_waiting, as the scorer reads it (a request count, so not
//     QueuedPrefillTokens).
//
// Where the signals differ: llm-d keeps every tier a block is on and counts the heaviest
// (getMaxWeight); Request.Tiers keeps the fastest, so a block held on the CPU and also on a disk
// or store counts 0.8 here where llm-d would count 1.0. Lower tiers here only continue the GPU
// prefix (vLLM's order of lookup), where llm-d also lets a GPU block continue a CPU run. The
// simulated engine's free blocks exclude cached-but-evictable ones, so its usage reads as cache
// occupancy, higher on a warm node than vLLM's kv_cache_usage_perc, which counts referenced
// blocks only. Ties go by rendezvous instead of max-score-picker's random choice, so replicas
// agree.
type llmdScore struct {
	cfg PolicyConfig
}

func (p *llmdScore) Name() string { return PolicyLLMD }

// Config is the policy's configuration.
func (p *llmdScore) Config() PolicyConfig { return p.cfg }

func (p *llmdScore) Choose(req *Request, nodes []NodeInfo, matchedTokens []int, now time.Time, d *Decision) error {
	if err := checkInput(nodes, matchedTokens, d); err != nil {
		return err
	}
	fillCandidates(d, nodes, matchedTokens, &p.cfg, p.cfg.LoadFactor, p.cfg.MinLoadBound)
	loP, hiP := math.Inf(1), math.Inf(-1) // over the nodes that matched the first block
	loQ, hiQ := math.MaxInt, math.MinInt
	for i := range nodes {
		if w, ok := p.prefix(req, nodes, matchedTokens, i); ok {
			loP, hiP = math.Min(loP, w), math.Max(hiP, w)
		}
		loQ, hiQ = min(loQ, nodes[i].Waiting), max(hiQ, nodes[i].Waiting)
	}
	for i := range d.Candidates {
		n := &nodes[i]
		prefix := 0.0
		if w, ok := p.prefix(req, nodes, matchedTokens, i); ok {
			prefix = 1
			if hiP > loP {
				prefix = (w - loP) / (hiP - loP)
			}
		}
		queue := 1.0
		if hiQ > loQ {
			queue = float64(hiQ-n.Waiting) / float64(hiQ-loQ)
		}
		usage := 0.0
		if n.CapacityBlocks > 0 {
			usage = float64(n.CapacityBlocks-min(max(n.FreeBlocks, 0), n.CapacityBlocks)) / float64(n.CapacityBlocks)
		}
		// Lower is better in a Decision: the negated sum.
		d.Candidates[i].Score = -(p.cfg.LLMDPrefixWeight*prefix + p.cfg.LLMDKVCacheWeight*(1-usage) + p.cfg.LLMDQueueWeight*queue)
	}
	finish(d, minScore(requestKey(req), nodes, d.Candidates), matchedTokens, ReasonLLMD)
	return nil
}

// prefix is candidate i's weighted prefix score before normalisation, in blocks: its GPU blocks
// and the blocks of each lower tier continuing them, each weighted by LLMDTierWeights. ok
// reports whether the node matched at least one block, i.e. whether llm-d's scorer lists it.
func (p *llmdScore) prefix(req *Request, nodes []NodeInfo, matchedTokens []int, i int) (w float64, ok bool) {
	bs := nodes[i].BlockSize
	if bs <= 0 {
		bs = req.BlockSize
	}
	if bs <= 0 {
		bs = 1
	}
	blocks := matchedTokens[i] / bs
	w = p.cfg.LLMDTierWeights[local.TierGPU] * float64(blocks)
	if i < len(req.Tiers) {
		for t := local.TierGPU + 1; t < local.NumTiers; t++ {
			b := req.Tiers[i][t] / bs
			blocks += b
			w += p.cfg.LLMDTierWeights[t] * float64(b)
		}
	}
	return w, blocks > 0
}

// inUnit reports whether v is in [0, 1].
func inUnit(v float64) bool { return v >= 0 && v <= 1 }

// validWeights reports whether every weight is a finite number >= 0.
func validWeights(ws ...float64) bool {
	for _, v := range ws {
		if !(v >= 0) || math.IsInf(v, 1) {
			return false
		}
	}
	return true
}
