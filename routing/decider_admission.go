package routing

import (
	"math"
	"time"
)

// The wait before a decision in a burst (POLICIES.md, "Bursts"): the router's turn among its
// peers, and, for a policy whose costs are predicted seconds, whether the burst's other
// decisions could change this one's at all.

// turn is how long a request that arrived at now waits for this router's turn, and the peer
// decisions expected in the same burst (the learned burst size, rounded up). The wait is 0
// unless this router has learned that its peers decide in bursts, in the same instants as it
// does (a trace's simultaneous arrivals, an agent's fan-out, a batch job), and then lasts until
// its turn in a stagger of the routers by name (SetRouterID), one slot (a few share latencies)
// per router ahead of it, at most MaxAdmissionDelay, counted from the burst's first decision. In
// a burst the routers then decide one after another, each seeing the decisions and load the
// ones before it shared, as one router deciding the burst in turn would; a router's own
// requests in the burst are decided together, each seeing the ones before it.
func (d *Decider) turn(now time.Time) (time.Duration, int) {
	if d.slot <= 0 {
		return 0, 0
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.id == "" {
		return 0, 0 // not sharing: no peers to take turns with
	}
	peers := d.peers.peers()
	if !d.conc.bursting(now) {
		return 0, 0
	}
	// Turns count from the burst's first decision, so that routers whose requests arrive a few
	// milliseconds apart keep one schedule, and a request that arrives after its router's turn
	// (decisions have been coming for a whole span) is decided at once.
	start := d.conc.burstStart(now, admissionSpan(peers, d.slot))
	turn := start.Add(admissionDelay(d.peers.rank(d.id), peers, d.slot)).Sub(now)
	return max(turn, 0), int(math.Ceil(d.conc.burstSize(now)))
}

// herdCoster is a policy whose costs are predicted seconds, so it can say what a candidate
// would cost once other requests were sent there first.
type herdCoster interface {
	// herdedCost is n's cost for req, matched tokens cached there, after others more requests
	// with req's uncached work were sent to n.
	herdedCost(req *Request, n *NodeInfo, matched, others int) float64
}

// AdmissionWait is how long the caller should wait before deciding req over its candidates:
// this router's turn in a burst (turn), leaving out the waits that cannot change the decision. When the policy's costs are predicted seconds (prefixmesh)
// it previews the decision (CommitNone, into c) and waits only if the peer decisions expected
// in the same burst (the learned burst size), each a request like this one sent to the chosen
// node first, could make another candidate cheaper: the contested requests of a burst, which
// would herd, take turns, and those whose prefix makes one node clearly best (a conversation's
// later turn, a long shared prefix) are decided at once. The bound counts every peer decision
// of the burst, not only those of the routers ahead, because the peers' own uncontested
// requests are decided at once too. Other policies wait every turn. nodes are as for Decide
// (which overwrites their in-flight fields); call Decide afterwards, after the wait, with the
// later time; callers that cannot wait skip it.
func (d *Decider) AdmissionWait(req *DecideRequest, nodes []NodeInfo, now time.Time, c *Choice) time.Duration {
	w, burst := d.turn(now)
	hc, ok := d.policy.(herdCoster)
	if w == 0 || !ok {
		return w
	}
	if err := d.Decide(req, nodes, now, CommitNone, c); err != nil {
		return w
	}
	next := math.Inf(1)
	for _, cd := range c.Candidates {
		if cd.Node != c.Node {
			next = min(next, cd.Score)
		}
	}
	best := &nodes[c.Node]
	rq := Request{PromptTokens: len(req.Tokens), BlockSize: blockSizeOf(best)}
	if hc.herdedCost(&rq, best, c.dec.MatchedTokens, burst) < next {
		return 0
	}
	return w
}
