package routing

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/prefixmesh/prefixmesh/local"
)

// The baseline policies (POLICIES.md), kept beside the default so the trace simulator compares like
// with like. Each is a faithful, deterministic restatement of a published policy over the same
// inputs; POLICIES.md says when each is the right choice.

// roundRobin sends request i to node i mod n, ignoring caches and load.
type roundRobin struct {
	cfg  PolicyConfig
	next atomic.Uint64
}

func (p *roundRobin) Name() string { return PolicyRoundRobin }

// Config is the policy's configuration.
func (p *roundRobin) Config() PolicyConfig { return p.cfg }

func (p *roundRobin) Choose(req *Request, nodes []NodeInfo, matchedTokens []int, now time.Time, d *Decision) error {
	if err := checkInput(nodes, matchedTokens, d); err != nil {
		return err
	}
	fillCandidates(d, nodes, matchedTokens, &p.cfg, p.cfg.LoadFactor, p.cfg.MinLoadBound)
	i := int((p.next.Add(1) - 1) % uint64(len(nodes)))
	finish(d, i, matchedTokens, ReasonRoundRobin)
	return nil
}

// leastLoaded sends each request to the node with the lowest Load (router in-flight plus the
// age-discounted node report), ties by rendezvous of the first block.
type leastLoaded struct {
	cfg PolicyConfig
}

func (p *leastLoaded) Name() string { return PolicyLeastLoaded }

// Config is the policy's configuration.
func (p *leastLoaded) Config() PolicyConfig { return p.cfg }

func (p *leastLoaded) Choose(req *Request, nodes []NodeInfo, matchedTokens []int, now time.Time, d *Decision) error {
	if err := checkInput(nodes, matchedTokens, d); err != nil {
		return err
	}
	fillCandidates(d, nodes, matchedTokens, &p.cfg, p.cfg.LoadFactor, p.cfg.MinLoadBound)
	for i := range d.Candidates {
		d.Candidates[i].Score = d.Candidates[i].Load
	}
	finish(d, minLoad(requestKey(req), nodes, d.Candidates), matchedTokens, ReasonLeastLoaded)
	return nil
}

// chwbl is consistent hashing with bounded loads (Mirrokni, Thorup and Zadimoghaddam 2016) keyed
// by the first block hash: walk the nodes in the key's rendezvous order and take the first one
// whose load + 1 stays within ceil(c × (total + 1) / n). The first acceptable node in descending
// weight order is the acceptable node of highest weight, so one pass suffices. It keeps a prefix's
// first block on one node until that node is full, without looking at any cache.
type chwbl struct {
	cfg PolicyConfig
}

func (p *chwbl) Name() string { return PolicyCHWBL }

// Config is the policy's configuration.
func (p *chwbl) Config() PolicyConfig { return p.cfg }

func (p *chwbl) Choose(req *Request, nodes []NodeInfo, matchedTokens []int, now time.Time, d *Decision) error {
	if err := checkInput(nodes, matchedTokens, d); err != nil {
		return err
	}
	// The pure guard of the paper (no MinLoadBound floor): this is the baseline as published.
	bound := fillCandidates(d, nodes, matchedTokens, &p.cfg, p.cfg.LoadFactor, 0)
	key := requestKey(req)
	for i := range d.Candidates {
		c := &d.Candidates[i]
		if !within(c.Load, bound) {
			c.Score = math.Inf(1)
			continue
		}
		// Lower is better: the negated weight, scaled into (-1, 0].
		c.Score = -float64(RendezvousWeight(key, nodes[i].ID)>>11) / (1 << 53)
	}
	best := pickRendezvous(key, nodes, d.Candidates, func(c *Candidate) bool { return !math.IsInf(c.Score, 1) })
	if best < 0 {
		best = minLoad(key, nodes, d.Candidates)
	}
	finish(d, best, matchedTokens, ReasonCHWBL)
	return nil
}

// longestPrefix sends each request to the node with the most matched tokens, ties to the least
// loaded, then by rendezvous. It maximises hits and ignores load entirely.
type longestPrefix struct {
	cfg PolicyConfig
}

func (p *longestPrefix) Name() string { return PolicyLongestPrefix }

// Config is the policy's configuration.
func (p *longestPrefix) Config() PolicyConfig { return p.cfg }

func (p *longestPrefix) Choose(req *Request, nodes []NodeInfo, matchedTokens []int, now time.Time, d *Decision) error {
	if err := checkInput(nodes, matchedTokens, d); err != nil {
		return err
	}
	fillCandidates(d, nodes, matchedTokens, &p.cfg, p.cfg.LoadFactor, p.cfg.MinLoadBound)
	for i := range d.Candidates {
		d.Candidates[i].Score = -float64(matchedTokens[i])
	}
	finish(d, longestThenLeast(requestKey(req), nodes, d.Candidates), matchedTokens, ReasonLongestPrefix)
	return nil
}

// longestThenLeast returns the candidate with the most matched tokens, ties to the lowest load,
// then the highest rendezvous weight.
func longestThenLeast(key uint64, nodes []NodeInfo, cands []Candidate) int {
	best := -1
	var bestW uint64
	for i := range cands {
		c := &cands[i]
		if best >= 0 {
			b := &cands[best]
			if c.MatchedTokens != b.MatchedTokens {
				if c.MatchedTokens < b.MatchedTokens {
					continue
				}
			} else if c.Load != b.Load {
				if c.Load > b.Load {
					continue
				}
			} else if RendezvousWeight(key, nodes[i].ID) <= bestW {
				continue
			}
		}
		best, bestW = i, RendezvousWeight(key, nodes[i].ID)
	}
	return best
}

// sglangGate restates sgl-router's cache-aware policy (SGLang, "sgl-router" README and
// sgl-project/sglang PR #2114, 2024): the system is imbalanced when max load − min load >
// balance_abs_threshold AND max load > balance_rel_threshold × min load; then the request goes to
// the shortest queue. Otherwise it goes to the node with the longest prefix match if the match
// ratio (matched / prompt tokens) exceeds cache_threshold, else to the least loaded node.
// (sgl-router's low-match branch picks the worker with the smallest approximate tree, i.e. the
// most free cache; with an exact index the least-loaded node is the closer analogue here.)
type sglangGate struct {
	cfg PolicyConfig
}

func (p *sglangGate) Name() string { return PolicySGLangGate }

// Config is the policy's configuration.
func (p *sglangGate) Config() PolicyConfig { return p.cfg }

func (p *sglangGate) Choose(req *Request, nodes []NodeInfo, matchedTokens []int, now time.Time, d *Decision) error {
	if err := checkInput(nodes, matchedTokens, d); err != nil {
		return err
	}
	fillCandidates(d, nodes, matchedTokens, &p.cfg, p.cfg.LoadFactor, p.cfg.MinLoadBound)
	key := requestKey(req)
	lo, hi := math.Inf(1), math.Inf(-1)
	for i := range d.Candidates {
		c := &d.Candidates[i]
		c.Score = -float64(c.MatchedTokens)
		lo, hi = math.Min(lo, c.Load), math.Max(hi, c.Load)
	}
	if hi-lo > float64(p.cfg.SGLangBalanceAbs) && hi > p.cfg.SGLangBalanceRel*lo {
		finish(d, minLoad(key, nodes, d.Candidates), matchedTokens, ReasonSGLangBalance)
		return nil
	}
	best := longestThenLeast(key, nodes, d.Candidates)
	if req.PromptTokens > 0 && float64(matchedTokens[best])/float64(req.PromptTokens) > p.cfg.SGLangCacheThreshold {
		finish(d, best, matchedTokens, ReasonSGLangCache)
		return nil
	}
	finish(d, minLoad(key, nodes, d.Candidates), matchedTokens, ReasonSGLangLowHit)
	return nil
}

// dynamoCost restates NVIDIA Dynamo's KV router cost (Dynamo docs, "Router Design" / "KV Cache
// Routing": cost = kv_overlap_score_weight × potential prefill blocks + potential active blocks,
// lowest wins; temperature 0, i.e. deterministic). Potential prefill blocks are the request's
// blocks less the node's overlap credit; potential active (decode) blocks are the blocks of the
// router's own in-flight requests to the node (NodeInfo.InFlightTokens / block size, what Dynamo's
// router tracks; load × request blocks when not tracked) plus the request's new blocks, those
// not already in the node's GPU cache. Node-reported free blocks are not used: a warm cache is
// full of evictable blocks, so capacity − free measures cache occupancy, not decode load. Ties go
// by rendezvous instead of Dynamo's random choice, so replicas agree.
//
// The overlap credit is Dynamo's tier-aware one (ai-dynamo/dynamo
// lib/kv-router/src/scheduling/selector.rs @01690d4, DefaultWorkerSelector::worker_logit):
// device blocks × 1 + host blocks × DynamoHostCacheHitWeight + disk blocks ×
// DynamoDiskCacheHitWeight + shared-pool blocks × DynamoSharedCacheMultiplier, and the prefill
// blocks are max(request blocks − credit, 0). The lower-tier blocks are those continuing the GPU
// prefix (Request.Tiers), as Dynamo's lower-tier matches extend the device match
// (lib/kv-router/src/scheduling/overlap.rs @13a4eea: host and disk "extension" blocks). Local
// storage counts as disk: Dynamo indexes vLLM's STORAGE medium as its Disk tier (Dynamo docs
// v1.6, "Native KV Offloading") and weighs its External tier as disk too (overlap.rs,
// cache_hit_weight_for_tier). Remote blocks, held in a pool off the node, take the multiplier
// Dynamo gives its shared pool (SGLang HiCache's L3 store). A lower-tier block is still a new
// active block: loading it takes a GPU block as recomputing it would, and in Dynamo the tiers
// enter only the prefill credit. With Request.Tiers nil the credit is the GPU match alone, the
// cost as before tiers.
//
// Not restated: the newer selector's raw prefill also counts the node's active prefill tokens,
// and its device credit decays with the node's excess prefill load; this restatement keeps the
// documented cost above and changes only the credit.
type dynamoCost struct {
	cfg PolicyConfig
}

func (p *dynamoCost) Name() string { return PolicyDynamoCost }

// Config is the policy's configuration.
func (p *dynamoCost) Config() PolicyConfig { return p.cfg }

func (p *dynamoCost) Choose(req *Request, nodes []NodeInfo, matchedTokens []int, now time.Time, d *Decision) error {
	if err := checkInput(nodes, matchedTokens, d); err != nil {
		return err
	}
	fillCandidates(d, nodes, matchedTokens, &p.cfg, p.cfg.LoadFactor, p.cfg.MinLoadBound)
	for i := range d.Candidates {
		c := &d.Candidates[i]
		n := &nodes[i]
		bs := n.BlockSize
		if bs <= 0 {
			bs = req.BlockSize
		}
		if bs <= 0 {
			bs = 1
		}
		reqBlocks := float64((req.PromptTokens + bs - 1) / bs)
		device := float64(matchedTokens[i] / bs)
		prefill := math.Max(reqBlocks-device-p.lowerCredit(req, i, bs), 0)
		fresh := math.Max(reqBlocks-device, 0) // the request's new GPU blocks
		active := float64((n.InFlightTokens + bs - 1) / bs)
		if n.InFlightTokens == 0 {
			active = c.Load * reqBlocks // not tracked: assume in-flight requests like this one
		}
		c.Score = p.cfg.DynamoOverlapWeight*prefill + active + fresh
	}
	finish(d, minScore(requestKey(req), nodes, d.Candidates), matchedTokens, ReasonDynamoCost)
	return nil
}

// lowerCredit is Dynamo's overlap credit, in blocks of bs tokens, for candidate i's lower-tier
// run; 0 when the request carries no tiers.
func (p *dynamoCost) lowerCredit(req *Request, i, bs int) float64 {
	if i >= len(req.Tiers) {
		return 0
	}
	t := &req.Tiers[i]
	return p.cfg.DynamoHostCacheHitWeight*float64(t[local.TierCPU]/bs) +
		p.cfg.DynamoDiskCacheHitWeight*float64(t[local.TierDisk]/bs+t[local.TierStorage]/bs) +
		p.cfg.DynamoSharedCacheMultiplier*float64(t[local.TierRemote]/bs)
}
