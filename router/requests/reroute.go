package requests

import (
	"cmp"
	"math"
	"slices"
	"sync"

	"github.com/prefixmesh/prefixmesh/routing"
)

// movableTicket is a gateway pick's accounting (Pick.Reroute): the ticket of the node that has
// the request now, and what moving it to a fallback needs, since a gateway says which node
// served only with the response.
type movableTicket struct {
	p *PolicyPicker

	mu        sync.Mutex // guards everything below
	t         *routing.Ticket
	hashes    *[]uint64 // the prompt's block hashes at blockSize, pooled; nil after Done
	blockSize int       // the chosen node's NodeInfo.BlockSize, as it reported it
	prompt    int
	alts      []alternateEstimate
	done      bool
}

// alternateEstimate is an alternate's estimated matched tokens at the decision.
type alternateEstimate struct {
	node    string
	matched int
}

// movableHashes pools movableTicket.hashes: the one piece of a gateway pick that grows with the
// prompt.
var movableHashes sync.Pool // *[]uint64

// movable gives pk the decision's alternates (up to req.Alternates, best first) and accounting
// that Reroute can move to one of them: Done, FirstToken and Reroute act on a movableTicket
// holding c's ticket.
func (p *PolicyPicker) movable(pk *Pick, t *routing.Ticket, c *routing.Choice, sc *pickScratch, req *PickRequest) {
	m := &movableTicket{p: p, t: t, blockSize: sc.nodes[c.Node].BlockSize, prompt: len(req.Tokens)}
	if b, _ := movableHashes.Get().(*[]uint64); b != nil {
		m.hashes = b
	} else {
		m.hashes = new([]uint64)
	}
	*m.hashes = append((*m.hashes)[:0], c.Hashes...)
	alts := alternates(c, req.Alternates)
	pk.Alternates = make([]string, len(alts))
	m.alts = make([]alternateEstimate, len(alts))
	for i, cd := range alts {
		pk.Alternates[i] = sc.urls[cd.Node]
		m.alts[i] = alternateEstimate{node: sc.nodes[cd.Node].ID, matched: cd.MatchedTokens}
	}
	pk.Done, pk.FirstToken, pk.Reroute = m.finish, m.firstToken, m.reroute
}

// alternates are up to n of c's candidates other than the chosen one, by the policy's score
// (lower is better), leaving out those a guard excluded (+Inf).
func alternates(c *routing.Choice, n int) []routing.Candidate {
	cands := make([]routing.Candidate, 0, len(c.Candidates))
	for _, cd := range c.Candidates {
		if cd.Node != c.Node && !math.IsInf(cd.Score, 1) && !math.IsNaN(cd.Score) {
			cands = append(cands, cd)
		}
	}
	slices.SortStableFunc(cands, func(a, b routing.Candidate) int { return cmp.Compare(a.Score, b.Score) })
	return cands[:min(n, len(cands))]
}

func (m *movableTicket) firstToken() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.done {
		m.t.FirstToken(m.p.now())
	}
}

func (m *movableTicket) finish(o Outcome) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.done {
		return
	}
	m.done = true
	m.t.Done(m.p.now(), succeeded(o))
	movableHashes.Put(m.hashes)
	m.hashes = nil
}

// reroute moves the request to node: the ticket it has is given back as failed (the gateway
// could not use that node), and a new one begins on node, with the prompt's hashes when node
// has the chosen node's block size (routing.Decider.Track).
func (m *movableTicket) reroute(node string) (estimate int, moved bool) {
	estimate = -1
	for _, a := range m.alts {
		if a.node == node {
			estimate = a.matched
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.done {
		return estimate, false
	}
	if m.t.Node() == node {
		return estimate, true
	}
	var info routing.NodeInfo
	found := false
	for _, n := range m.p.src.Nodes() {
		if n.Info.ID == node {
			info, found = n.Info, true
			break
		}
	}
	if !found {
		return estimate, false
	}
	var hashes []uint64
	if info.BlockSize == m.blockSize {
		hashes = *m.hashes
	}
	now := m.p.now()
	m.t.Done(now, false)
	m.t = m.p.dec.Track(&info, hashes, m.prompt, now)
	return estimate, true
}
