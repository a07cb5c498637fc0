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

// Config is the policy's configuration.
func (p *prefixMesh) Config() PolicyConfig { return p.cfg }

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
		c.Score = expectedTTFT(req, &nodes[i], matchedTokens[i], p.tiersOf(req, i), &p.cfg)
	}
	if len(nodes) == 1 {
		finish(d, 0, matchedTokens, ReasonOnlyCandidate)
		return nil
	}
	best := minScore(requestKey(req), nodes, d.Candidates)
	if req.SessionKey != 0 && best >= 0 {
		// The session's node wins whenever it is among the cheapest: it takes the ties (no
		// prefix anywhere yet, equal queues), and it keeps the session while its cached prefix
		// makes it cheapest, but a session never waits behind a queue another node would spare
		// it.
		if s := pickRendezvous(req.SessionKey, nodes, d.Candidates, func(c *Candidate) bool { return true }); s == best ||
			(!math.IsInf(d.Candidates[s].Score, 1) && sameScore(d.Candidates[s].Score, d.Candidates[best].Score)) {
			finish(d, s, matchedTokens, ReasonSession)
			return nil
		}
	}
	if best < 0 {
		// Every node is over the bound, which only fractional (age-discounted) loads allow:
		// fall back to the least loaded.
		best = minLoad(requestKey(req), nodes, d.Candidates)
		finish(d, best, matchedTokens, ReasonMinTTFT)
		return nil
	}
	if req.Concurrency >= SpreadMinConcurrency {
		if s := spread(req, nodes, matchedTokens, best, d.Candidates, &p.cfg); s != best {
			finish(d, s, matchedTokens, ReasonBurstSpread)
			return nil
		}
	}
	finish(d, best, matchedTokens, ReasonMinTTFT)
	return nil
}

// SpreadMinConcurrency is the expected number of unseen concurrent decisions from which
// prefixmesh spreads a request (Request.Concurrency): at least one other router deciding in the
// same instant, so smooth traffic, where that happens a few times in a hundred, keeps the exact
// cheapest choice.
const SpreadMinConcurrency = 0.5

// spread chooses among the candidates a burst would fill: if the Concurrency other routers'
// decisions in this instant are like this one, each adds the request's work at the cheapest node
// (best), and one router deciding them in turn would water-fill the costs — every node whose
// cost is below the level L at which the filled volume equals that work takes a share
// proportional to L − cost. Each request is placed by a weighted rendezvous of its own chain
// (Schindelhauer and Schomaker's weighted distributed hash tables: the node maximising
// w / −ln(u), u the request's uniform hash on the node, wins with probability w / Σw), so the
// routers' choices in one instant spread as that water-filling does, a request's choice is the
// same on every router, and identical prompts still land together. Costs carry the miss penalty,
// so a node without the request's prefix joins only when the burst's work outweighs the cache.
func spread(req *Request, nodes []NodeInfo, matched []int, best int, cands []Candidate, cfg *PolicyConfig) int {
	rate := nominalRate(&nodes[best], cfg) / nodes[best].TTFT.PrefillScale()
	need := float64(max(req.PromptTokens-matched[best], 0))
	vol := req.Concurrency * need / rate // seconds of work the unseen decisions add
	lo := cands[best].Score
	if !(vol > 0) {
		return best
	}
	// The level L: sum over candidates of max(0, L − score) == vol, by bisection (monotone).
	hi := lo + vol
	for range 48 {
		mid := (lo + hi) / 2
		f := 0.0
		for i := range cands {
			if s := cands[i].Score; s < mid {
				f += mid - s
			}
		}
		if f < vol {
			lo = mid
		} else {
			hi = mid
		}
	}
	level := hi
	key := mix64(requestKey(req) ^ spreadKey(req))
	choice, bestV := best, -1.0
	for i := range cands {
		w := level - cands[i].Score
		if !(w > 0) || math.IsInf(cands[i].Score, 1) {
			continue
		}
		u := (float64(RendezvousWeight(key, nodes[i].ID)>>11) + 0.5) / (1 << 53)
		if v := w / -math.Log(u); v > bestV {
			choice, bestV = i, v
		}
	}
	return choice
}

// spreadKey is the request's own key for spreading: its last block hash (the whole chain) and
// prompt length, so requests that share a first block but differ later spread apart.
func spreadKey(req *Request) uint64 {
	k := uint64(req.PromptTokens)
	if n := len(req.Hashes); n > 0 {
		k ^= mix64(req.Hashes[n-1])
	}
	return k ^ req.SessionKey
}

// expectedTTFT is the prefixmesh cost of sending req to n given matched tokens there, in seconds:
// the node's predicted TTFT (PredictTTFT, by what the router learned of it) plus the miss
// penalty's weight on the request's uncached tokens at the node's learned prefill rate.
//
// Tokens on lower tiers (tiers, nil for none) that load faster than they prefill are not
// uncached: they cost their load time instead. A tier at least as slow as recomputing earns
// nothing — its tokens count as uncached, miss penalty included — and costs its excess load
// time on top, since the engine loads what its connector holds whatever the router thinks: a
// node with only such hits never beats an idle node without them.
func expectedTTFT(req *Request, n *NodeInfo, matched int, tiers *TierTokens, cfg *PolicyConfig) float64 {
	need := max(req.PromptTokens-matched, 0)
	credited, load := tierCost(n, tiers, cfg)
	need = max(need-credited, 0)
	rate := nominalRate(n, cfg)
	return PredictTTFT(n, need, cfg) + load*n.TTFT.PrefillScale()/rate +
		cfg.MissPenalty*n.TTFT.fleetScale()*float64(need)/rate
}

// tiersOf is candidate i's lower-tier match, nil when the request carries none or the policy
// ignores tiers.
func (p *prefixMesh) tiersOf(req *Request, i int) *TierTokens {
	if p.cfg.IgnoreTiers || i >= len(req.Tiers) {
		return nil
	}
	return &req.Tiers[i]
}

// herdedCost is expectedTTFT after others more requests with req's uncached work on n were sent
// there (and had not reached their first token): what the other decisions of a burst could
// add to n (Decider.AdmissionWait). The load guard is not applied again.
func (p *prefixMesh) herdedCost(req *Request, n *NodeInfo, matched, others int) float64 {
	h := *n
	need := max(req.PromptTokens-matched, 0)
	h.InFlight += others
	h.InFlightTokens += others * req.PromptTokens
	h.InFlightPrefillTokens += others * need
	return expectedTTFT(req, &h, matched, nil, &p.cfg)
}

// sameScore reports whether two finite costs are equal up to float rounding.
func sameScore(a, b float64) bool {
	return math.Abs(a-b) <= 1e-9*max(math.Abs(a), math.Abs(b))+1e-15
}

// minScore returns the candidate with the lowest finite Score, ties to the highest rendezvous
// weight of key, or -1 when every score is +Inf. Ties are the scores equal to the lowest up to
// float rounding; only those are weighed, so a decision hashes a node id only where it matters.
func minScore(key uint64, nodes []NodeInfo, cands []Candidate) int {
	lo := math.Inf(1)
	for i := range cands {
		if s := cands[i].Score; s < lo {
			lo = s
		}
	}
	if math.IsInf(lo, 1) {
		return -1
	}
	return pickRendezvous(key, nodes, cands, func(c *Candidate) bool {
		return c.Score == lo || (!math.IsInf(c.Score, 1) && sameScore(c.Score, lo))
	})
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
