package routing

import (
	"math"
	"time"
)

// What a router learns of each node's time to first token (ttft.go), and how routers sharing
// decisions learn from each other's first tokens: every router's own first tokens go, with the
// features its policy saw, to its peers (router/peershare sends them with the load reports; the
// simulator the same), so eight routers each seeing an eighth of the traffic learn the fits one
// router would from all of it.

// observeTTFT teaches the chosen node's learner the ticket's first token at now. Callers hold
// d.mu.
func (d *Decider) observeTTFT(t *Ticket, now time.Time) {
	if d.noLearn || t.decided.IsZero() {
		return // learning off, or a tracked request (Track): no decision whose features it has
	}
	if !d.index.Has(t.node) {
		return // the node left (ForgetNode dropped its learner): do not bring it back
	}
	l := d.learnerLocked(t.node)
	y := now.Sub(t.decided).Seconds()
	d.learnTierLocked(t, y)
	// The fits model prefill and queueing: the load from lower tiers, predicted apart, is
	// taken out of what they learn.
	y = max(y-t.loadSec, 0)
	d.learnLocked(l, t.work, t.seqs, y)
	if d.id != "" { // sharing: the peers learn from it too
		d.outbox.push(TTFTObservation{Node: t.node, Work: secondsDuration(t.work),
			Seqs: int(math.Round(t.seqs * TTFTSeqUnit)), TTFT: secondsDuration(y)})
	}
}

// learnLocked teaches the fleet fit and node's learner l one first token.
func (d *Decider) learnLocked(l *ttftLearner, work, seqs, ttft float64) {
	d.fleet.observe(work, seqs, ttft, TTFTFit{}, ttftPrior, ttftFleetMemory)
	l.observe(work, seqs, ttft, d.fleet.fit, ttftNodePrior, ttftNodeMemory)
}

// LearnedTTFT is what this router has learned of node's time to first token: the node's own fit,
// else the fleet's (the zero fit before any first token).
func (d *Decider) LearnedTTFT(node string) TTFTFit {
	d.mu.Lock()
	defer d.mu.Unlock()
	f := d.fleet.fit
	if l := d.learned[node]; l != nil {
		f = l.fit
	}
	f.FleetScale = d.fleet.fit.PrefillScale()
	return f
}

// NodeTTFT is one node's learned fit (AppendLearnedTTFT).
type NodeTTFT struct {
	Node string
	Fit  TTFTFit
}

// AppendLearnedTTFT appends every node fit this router holds, in no particular order, and
// returns the fleet fit.
func (d *Decider) AppendLearnedTTFT(dst []NodeTTFT) ([]NodeTTFT, TTFTFit) {
	d.mu.Lock()
	defer d.mu.Unlock()
	fleet := d.fleet.fit
	fleet.FleetScale = fleet.PrefillScale()
	for id, l := range d.learned {
		f := l.fit
		f.FleetScale = fleet.FleetScale
		dst = append(dst, NodeTTFT{Node: id, Fit: f})
	}
	return dst, fleet
}

// learnerLocked is node's learner, created on first use. Callers hold d.mu.
func (d *Decider) learnerLocked(node string) *ttftLearner {
	l := d.learned[node]
	if l == nil {
		l = new(ttftLearner)
		d.learned[node] = l
		d.learnedGen++
	}
	return l
}

// TTFTObservation is one first token a router observed, as its peers learn from it: the
// features its policy saw when it sent the request there (ttftFeatures) and the time it took.
type TTFTObservation struct {
	Node string
	Work time.Duration // the nominal prefill time of the work ahead of and including the request's
	Seqs int           // sequences on the node as the router knew them
	TTFT time.Duration
}

// secondsDuration is s seconds as a duration, saturating at an hour (the learner refuses more
// than ttftMaxSec anyway).
func secondsDuration(s float64) time.Duration {
	if !(s < 3600) {
		return time.Hour
	}
	return time.Duration(s * float64(time.Second))
}

// ttftOutboxSize bounds the observations waiting for the sharer: a busy router's first tokens
// of a few share intervals; the oldest are dropped beyond it (the peers then learn from fewer).
const ttftOutboxSize = 256

// ttftOutbox is a ring of the observations not yet shared. The Decider's mu guards it.
type ttftOutbox struct {
	obs     [ttftOutboxSize]TTFTObservation
	head, n int
}

func (o *ttftOutbox) push(x TTFTObservation) {
	if o.n == ttftOutboxSize {
		o.head = (o.head + 1) % ttftOutboxSize
		o.n--
	}
	o.obs[(o.head+o.n)%ttftOutboxSize] = x
	o.n++
}

// AppendTTFTObservations appends, oldest first, this router's first-token observations not yet
// taken and forgets them: what a sharer sends its peers. Only a router with an id (SetRouterID)
// keeps them.
func (d *Decider) AppendTTFTObservations(dst []TTFTObservation) []TTFTObservation {
	d.mu.Lock()
	defer d.mu.Unlock()
	o := &d.outbox
	for ; o.n > 0; o.n-- {
		dst = append(dst, o.obs[o.head])
		o.obs[o.head] = TTFTObservation{}
		o.head = (o.head + 1) % ttftOutboxSize
	}
	return dst
}

// PeerTTFT teaches this router's fits a peer's first-token observations, as if they were its
// own. Observations naming a node the index does not hold (not a member, or gone) are skipped,
// and the learner refuses garbage (negative, over a minute); it returns how many were used.
func (d *Decider) PeerTTFT(obs []TTFTObservation) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.noLearn {
		return 0
	}
	used := 0
	for i := range obs {
		x := &obs[i]
		work, seqs, ttft := x.Work.Seconds(), float64(x.Seqs)/TTFTSeqUnit, x.TTFT.Seconds()
		if !plausibleTTFT(work, seqs, ttft) || !d.index.Has(x.Node) {
			continue
		}
		d.learnLocked(d.learnerLocked(x.Node), work, seqs, ttft)
		used++
	}
	return used
}
