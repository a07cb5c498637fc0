package routing

import (
	"time"

	"github.com/prefixmesh/prefixmesh/local"
)

// Track counts a request that was decided already as in flight on node n from now, as a
// CommitBegin decision for n would: a gateway that fell back from the chosen node to another one
// (the ext_proc endpoint picker hears which node served only with the response), whose first
// ticket the caller gives back as failed. hashes are the prompt's block hashes at n's block size,
// or nil when the caller has none at that size (then only the load is counted and nothing is held
// in the overlay); promptTokens is the prompt's length. n's matched tokens are estimated now from
// the index and the overlay, as Decide estimates a candidate (0 for a cold node), so that only the
// uncached part counts as prefill in flight; the part of the chain beyond what n's summary
// reports is held in the overlay until the ticket's first token, and OnDecision hears of it
// (outside the lock). The caller calls the ticket's Done exactly once.
func (d *Decider) Track(n *NodeInfo, hashes []uint64, promptTokens int, now time.Time) *Ticket {
	promptTokens = max(promptTokens, 0)
	bs := blockSizeOf(n)
	ids := [1]string{n.ID}
	var blocks, iblocks [1]int

	d.mu.Lock()
	if len(hashes) > 0 && !n.Cold { // a cold node's summary may over-estimate: no affinity from it
		d.estimate(hashes, ids[:], blocks[:], iblocks[:], now)
	}
	matched := local.EngineCachedTokens(blocks[0]*bs, promptTokens, bs)
	indexed := min(iblocks[0], len(hashes))
	// As Decide's CommitBegin. Its first token teaches the TTFT fits nothing: the fallback's
	// moment, and so its time to first token, is the gateway's.
	t := d.beginLocked(n.ID, InFlight{Requests: 1, Tokens: promptTokens, PrefillTokens: max(0, promptTokens-matched)}, hashes[indexed:], now)
	d.mu.Unlock()

	if len(hashes) > 0 && d.hooks.OnDecision != nil {
		d.hooks.OnDecision(n.ID, hashes, indexed, now)
	}
	return t
}
