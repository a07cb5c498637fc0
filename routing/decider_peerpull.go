package routing

import "time"

// The Decider's side of peer pull (peerpull.go). Decide has already estimated every candidate
// (index, overlay, lower tiers) and filled its load and learned fits; PlanPeerPull reads those
// estimates from the Choice (the indexed runs, without the overlay's pending prefixes), hashes
// nothing and estimates nothing again, and asks PlanPeerPull
// whether the chosen node should fetch a holder's longer run. A committed request that pulls
// computes only the rest: its ticket counts that much prefill work in flight on its node, and
// its first token, which waits for the transfer too, teaches the node's TTFT fit nothing (as
// PlanPrefill's decode leg).

// PlanPeerPull decides, for the request c was decided for over nodes (the same candidates, as
// Decide left them), whether the chosen node pulls the prompt's prefix from another candidate.
// Call it when the request's prefill runs on c.Node: with no P/D, or when PlanPrefill kept it
// local (Prefill.Node −1); under a remote prefill the decode node fetches from the prefill node
// instead. With a pull and a committed ticket (CommitBegin) not yet at its first token, the
// ticket's prefill work in flight becomes the prompt less what the node will then hold, and its
// first token is not learned as the node's TTFT. It allocates nothing.
func (d *Decider) PlanPeerPull(req *DecideRequest, nodes []NodeInfo, c *Choice) PeerPull {
	k := len(nodes)
	if c.Node < 0 || c.Node >= k || len(c.matched) < k || len(c.lower) < k {
		return PeerPull{Source: -1, Reason: PeerPullNoHolder} // no decision over these nodes
	}
	prompt := len(req.Tokens)
	// What each engine has computed: its index run and what this router saw it compute, not
	// the overlay's pending prefixes (a holder sent the run but not done with it has nothing
	// to serve yet, and a chosen node a sibling request was just sent does not hold it either).
	// The pending ones only add to Decide's estimates, and the chosen node has computed at least
	// its index run, so without a candidate estimated past that there is no holder, and Decide's
	// estimates answer as well (the common case, without another pass over the overlay).
	gpu := c.matched[:k]
	if len(c.iblocks) >= k && someLonger(c.matched[:k], c.Node, c.iblocks[c.Node]*blockSizeOf(&nodes[c.Node])) {
		d.computedRuns(nodes, c)
		gpu = c.pulls[:k]
	}
	in := PeerPullInput{PromptTokens: prompt, BlockSize: blockSizeOf(&nodes[c.Node]), Nodes: nodes,
		Chosen: c.Node, GPU: gpu, Lower: c.lower[:k], Transfer: d.TransferFit()}
	out := PlanPeerPull(&in, &d.pcfg)
	if out.Source < 0 || c.Ticket == nil {
		return out
	}
	d.ticketPulled(c.Ticket, max(prompt-out.MatchedTokens, 0))
	return out
}

// someLonger reports whether a candidate other than chosen has an estimated run past own.
func someLonger(matched []int, chosen, own int) bool {
	for i, m := range matched {
		if i != chosen && m > own {
			return true
		}
	}
	return false
}

// computedRuns fills c.pulls with each candidate's computed GPU run in tokens: the index's run
// and the overlay's records past it, without its pending prefixes. A candidate of another block
// size than the chosen node's keeps its index run alone.
func (d *Decider) computedRuns(nodes []NodeInfo, c *Choice) {
	k := len(nodes)
	c.pulls = grow(c.pulls, k)
	copy(c.pulls, c.iblocks[:k])
	if d.overlay != nil {
		d.overlay.EstimateComputed(c.hashes, c.ids[:k], c.pulls, c.at)
	}
	// The chosen node's own decision may be in the overlay by now (a recorded one, CommitRecord):
	// its run is at most what Decide saw before it.
	bs := blockSizeOf(&nodes[c.Node])
	c.pulls[c.Node] = min(c.pulls[c.Node], c.matched[c.Node]/bs)
	for i := range nodes {
		switch {
		case nodes[i].Cold:
			c.pulls[i] = 0
		case blockSizeOf(&nodes[i]) != bs:
			c.pulls[i] = c.iblocks[i] * blockSizeOf(&nodes[i])
		default:
			c.pulls[i] *= bs
		}
	}
}

// ticketPulled sets a committed request's prefill work to prefill tokens and stops its first
// token from teaching a fit. It takes t.mu, then d.mu (Ticket.releaseLocked's order).
func (d *Decider) ticketPulled(t *Ticket, prefill int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.first || t.done {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if l := d.own[t.node]; l != nil {
		l.PrefillTokens -= t.load.PrefillTokens - prefill
	}
	t.load.PrefillTokens = prefill
	t.decided = time.Time{}
}
