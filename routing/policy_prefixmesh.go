package routing

import (
	"math"
	"time"
)

// prefixMesh is the default policy (POLICIES.md, "prefixmesh (default)"). For each candidate k it estimates the time to
// first token of the request if sent to k,
//
//	TTFT(k) = (queued(k) + max(0, prompt − matched(k))) / rate(k)
//
// where queued(k) is the uncached prefill work ahead of the request: the larger of the node's
// report, drained at rate(k) over the report's age, and the router's own fresh count of prefill
// tokens it sent there (NodeInfo.InFlightPrefillTokens). The cost it minimises weighs the
// uncached tokens (1 + MissPenalty) times — a miss also costs the requests queued behind it and
// the prefixes its duplicate evicts (see PolicyConfig.MissPenalty) — so it follows a cached prefix
// until the node's queue outweighs what the cache saves, then replicates the prefix elsewhere.
//
// Only nodes within the bounded-load guard compete: load(k) + 1 <= max(ceil(c × (total load + 1)
// / n), MinLoadBound) (Mirrokni, Thorup and Zadimoghaddam, "Consistent Hashing with Bounded
// Loads", 2016), so a hot prefix that looks cheapest everywhere it is cached still spreads once
// its nodes carry more than c times the mean. Exact ties (typically: no match anywhere and equal
// queues) go to the highest rendezvous weight of the first block hash, so requests that share a
// first block but are not yet in any summary agree on one node, and two replicas with the same
// view make the same choice.
//
// Session affinity: a request with a SessionKey goes to the node with the highest rendezvous
// weight for the session among the candidates, as long as that node is within the load bound;
// otherwise it is routed like any other request (and returns once the node is back under the
// bound). Sticking a session to one node keeps its growing conversation prefix, and any
// session-keyed state on the node, in one place even when the summary lags.
type prefixMesh struct {
	cfg PolicyConfig
}

var _ Policy = (*prefixMesh)(nil)

func (p *prefixMesh) Name() string { return PolicyPrefixMesh }

func (p *prefixMesh) Choose(req *Request, nodes []NodeInfo, matchedTokens []int, now time.Time, d *Decision) error {
	if err := checkInput(nodes, matchedTokens, d); err != nil {
		return err
	}
	bound := fillCandidates(d, nodes, matchedTokens, &p.cfg, p.cfg.LoadFactor, p.cfg.MinLoadBound)
	for i := range d.Candidates {
		c := &d.Candidates[i]
		if !within(c.Load, bound) {
			c.Score = math.Inf(1)
			continue
		}
		c.Score = expectedTTFT(req, &nodes[i], matchedTokens[i], &p.cfg)
	}
	if len(nodes) == 1 {
		finish(d, 0, matchedTokens, ReasonOnlyCandidate)
		return nil
	}
	if req.SessionKey != 0 {
		s := pickRendezvous(req.SessionKey, nodes, d.Candidates, func(c *Candidate) bool { return true })
		if !math.IsInf(d.Candidates[s].Score, 1) {
			finish(d, s, matchedTokens, ReasonSession)
			return nil
		}
	}
	best := minScore(requestKey(req), nodes, d.Candidates)
	if best < 0 {
		// Every node is over the bound, which only fractional (age-discounted) loads allow:
		// fall back to the least loaded.
		best = minLoad(requestKey(req), nodes, d.Candidates)
	}
	finish(d, best, matchedTokens, ReasonMinTTFT)
	return nil
}

// expectedTTFT is the prefixmesh cost of sending req to n given matched tokens there, in seconds
// (the expected TTFT when MissPenalty is 0).
func expectedTTFT(req *Request, n *NodeInfo, matched int, cfg *PolicyConfig) float64 {
	rate := n.PrefillTokensPerSec
	if !(rate > 0) {
		rate = cfg.DefaultPrefillTokensPerSec
	}
	// The report is LoadAge old; the node has been draining its queue at rate since.
	queued := float64(n.QueuedPrefillTokens) - rate*n.LoadAge.Seconds()
	queued = math.Max(queued, float64(n.InFlightPrefillTokens))
	queued = math.Max(queued, 0)
	need := float64(req.PromptTokens - matched)
	if need < 0 {
		need = 0
	}
	return (queued + (1+cfg.MissPenalty)*need) / rate
}

// sameScore reports whether two finite costs are equal up to float rounding.
func sameScore(a, b float64) bool {
	return math.Abs(a-b) <= 1e-9*math.Max(math.Abs(a), math.Abs(b))+1e-15
}

// minScore returns the candidate with the lowest finite Score, ties to the highest rendezvous
// weight of key, or -1 when every score is +Inf.
func minScore(key uint64, nodes []NodeInfo, cands []Candidate) int {
	best := -1
	var bestW uint64
	for i := range cands {
		s := cands[i].Score
		if math.IsInf(s, 1) {
			continue
		}
		if best >= 0 && !sameScore(s, cands[best].Score) && s > cands[best].Score {
			continue
		}
		w := RendezvousWeight(key, nodes[i].ID)
		if best >= 0 && sameScore(s, cands[best].Score) && w <= bestW {
			continue
		}
		best, bestW = i, w
	}
	return best
}

// minLoad returns the candidate with the lowest Load, ties to the highest rendezvous weight.
func minLoad(key uint64, nodes []NodeInfo, cands []Candidate) int {
	best := -1
	var bestW uint64
	for i := range cands {
		l := cands[i].Load
		if best >= 0 && l > cands[best].Load {
			continue
		}
		w := RendezvousWeight(key, nodes[i].ID)
		if best >= 0 && l == cands[best].Load && w <= bestW {
			continue
		}
		best, bestW = i, w
	}
	return best
}

// pickRendezvous returns the candidate accepted by ok with the highest rendezvous weight for key,
// or -1 when ok accepts none.
func pickRendezvous(key uint64, nodes []NodeInfo, cands []Candidate, ok func(c *Candidate) bool) int {
	best := -1
	var bestW uint64
	for i := range cands {
		if !ok(&cands[i]) {
			continue
		}
		if w := RendezvousWeight(key, nodes[i].ID); best < 0 || w > bestW {
			best, bestW = i, w
		}
	}
	return best
}
