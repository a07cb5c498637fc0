package routing

import (
	"time"

	"github.com/prefixmesh/prefixmesh/local"
)

// The Decider's side of disaggregation (disagg.go): after Decide chose the decode node among the
// decode-capable candidates, PlanPrefill estimates the prefill candidates as Decide estimates any
// (index, overlay, lower tiers, this router's and its peers' loads, the learned fits) and decides
// where the prefill runs. A remote prefill is a request of its own on the prefill node: it is
// counted in flight there and holds its prefix in the overlay, and its answer (the prefill leg's
// one token) teaches that node's TTFT fit. The decode leg then prefills nothing: its ticket stops
// counting prefill work and learns no TTFT, since its first byte waits for another node's
// prefill and the transfer; the transfer's time is learned instead (ObserveTransfer).

// Prefill is a disaggregation decision and, when committed, the prefill leg's ticket.
type Prefill struct {
	Plan PrefillPlan
	// Node is the prefill node's index in the candidates given to PlanPrefill (-1: local).
	Node int
	// MatchedTokens is the prefill node's estimate (what it will report cached).
	MatchedTokens int
	// Ticket is the prefill leg (CommitBegin and a remote prefill only): call its FirstToken
	// when the leg answers and Done exactly once.
	Ticket *Ticket
}

// PlanPrefill decides, for the request c was decided for (decode node nodes[c.Node] as Decide
// left it), whether its prefill runs on one of prefill, and commits the prefill leg as commit
// says. With a remote prefill and CommitBegin, the decode leg's ticket (c.Ticket) is changed to
// count no prefill work and to learn no TTFT.
func (d *Decider) PlanPrefill(req *DecideRequest, decode *NodeInfo, c *Choice, prefill []NodeInfo, mode DisaggMode, now time.Time, commit Commit) Prefill {
	out := Prefill{Node: -1}
	k := len(prefill)
	bs := blockSizeOf(decode)
	hashes := c.Hashes
	ids := make([]string, 0, k) // a handful of prefill nodes; P/D requests are long
	for i := range prefill {
		ids = append(ids, prefill[i].ID)
	}
	blocks, iblocks := make([]int, k), make([]int, k)
	match := make([]TierTokens, k)
	if mode != DisaggNever && k > 0 {
		d.estimate(hashes, ids, blocks, iblocks, now)
		for i := range prefill {
			if prefill[i].Cold || blockSizeOf(&prefill[i]) != bs {
				blocks[i] = 0 // no affinity from a cold summary; another block size is not estimated
			}
		}
		d.index.ContinueLower(hashes, ids, blocks, bs, match)
		for i := range prefill {
			if prefill[i].Cold || blockSizeOf(&prefill[i]) != bs {
				match[i] = TierTokens{}
			}
			match[i][local.TierGPU] = blocks[i] * bs
		}
	}
	prompt := len(req.Tokens)
	d.mu.Lock()
	defer d.mu.Unlock()
	for i := range prefill {
		n := &prefill[i]
		l := d.inFlightLocked(n.ID)
		n.InFlight, n.InFlightTokens, n.InFlightPrefillTokens = l.Requests, l.Tokens, l.PrefillTokens
		n.TTFT = d.fleet.fit
		if ln := d.learned[n.ID]; ln != nil && ln.distinctFrom(d.fleet.fit) {
			n.TTFT = ln.fit
		}
		n.TTFT.FleetScale = d.fleet.fit.PrefillScale()
		n.TierLoad = d.tierLoadLocked(n.ID)
	}
	in := PrefillInput{PromptTokens: prompt, BlockSize: bs, Decode: decode, DecodeMatch: c.Tiers,
		Prefill: prefill, PrefillMatch: match, Transfer: d.transfer.Fit()}
	out.Plan = PlanPrefill(&in, mode, &d.pcfg)
	out.Node = out.Plan.Prefill
	if out.Node < 0 {
		return out
	}
	p := &prefill[out.Node]
	out.MatchedTokens = local.EngineCachedTokens(match[out.Node].Total(), prompt, bs)
	if commit != CommitBegin {
		return out
	}
	indexed := min(iblocks[out.Node], len(hashes))
	t := d.beginLocked(p.ID, InFlight{Requests: 1, Tokens: prompt, PrefillTokens: max(0, prompt-out.MatchedTokens)}, hashes[indexed:], now)
	t.decided = now
	d.noteTiers(t, p, &match[out.Node])
	t.work, t.seqs = ttftFeatures(p, prompt-match[out.Node][local.TierGPU]-t.credited, &d.pcfg)
	out.Ticket = t
	if dt := c.Ticket; dt != nil && !dt.first {
		// The decode leg prefills nothing now, and its first byte is not its own TTFT.
		if l := d.own[dt.node]; l != nil {
			l.PrefillTokens -= dt.load.PrefillTokens
		}
		dt.load.PrefillTokens = 0
		dt.decided = time.Time{}
	}
	return out
}

// ObserveTransfer teaches the router's transfer fit one KV transfer of the request plan was
// made for: the time a door saw from the prefill leg's answer to the decode leg's first byte,
// less the decode node's predicted wait then (plan.DecodeWait), for plan.Transfer tokens.
func (d *Decider) ObserveTransfer(plan *PrefillPlan, observed float64) {
	sec := max(observed-plan.DecodeWait, 0)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.transfer.Observe(plan.Transfer, sec)
}

// TransferFit is what this router has learned of moving KV between nodes.
func (d *Decider) TransferFit() TransferFit {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.transfer.Fit()
}
