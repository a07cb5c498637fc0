package routing

import "time"

// Decisions in one instant (POLICIES.md, "Bursts"). Replicas with the same view that decide in
// the same instant cannot see each other: a peer's decision reaches this router a share delay
// later, and its load report later still. Without more, the cheapest node of a shared view takes
// the whole burst (a herd), where one router, seeing its own in-flight work after each choice,
// would have spread it. A router can, however, learn after the fact how many decisions its peers
// took beside its own: the peer decisions it receives within a window around each of its
// decisions. concurrency keeps that count's moving average and, beside it, the count within a
// window ten times as wide; when the narrow count stands well above its share of the wide one
// (what decisions arriving at random at the local rate would give), the router is in bursts,
// and it waits its turn before deciding (Decider.AdmissionWait), so the replicas decide one
// after another as one router would. Smooth traffic, however fast, and a rate that swings over
// seconds are routed at once.

// DefaultConcurrencyWindow is how long after one of its decisions a router counts peers'
// decisions as taken unseen beside it: a few memberlist datagram latencies inside a cluster.
const DefaultConcurrencyWindow = 5 * time.Millisecond

// concurrencyAlpha is the weight of one decision's count in the moving average: about the last
// ten decisions count, so a router adapts within a few bursts.
const concurrencyAlpha = 0.2

// concurrencyOwn bounds this router's decisions still inside their window (a burst of more than
// this in one window settles the oldest early, counting what it saw so far).
const concurrencyOwn = 64

// concurrencySeen is the size of the lossy table that tells a peer's refresh of a pending
// request (RefreshPending, the same first hash again) from a new decision.
const concurrencySeen = 1024

// concurrency estimates how many decisions other routers take, unseen, beside each of this
// router's. Not safe for concurrent use; the Decider's mu guards it.
type concurrency struct {
	window time.Duration
	own    [concurrencyOwn]ownDecision
	head   int // own[head] is the oldest
	n      int
	est    float64 // unseen: peer decisions received within window after an own decision
	burst  float64 // peer decisions received within window + stagger span either side
	wide   float64 // peer decisions received within concurrencyWide times that after

	// The last peer packet, to tell the continuation of a decision split over packets.
	lastPeer, lastNode string
	lastEnd            int
	lastAt             time.Time

	seen [concurrencySeen]seenDecision

	// Receipt times of the latest peer decisions, to count those just before an own decision.
	recent     [concurrencyRecent]time.Time
	recentNext int
	recentLen  int // how many of recent have been written (recentAt)
}

// recentAt is the k-th latest peer receipt, k from 1 to recentLen. Receipts are written in the
// order they are received, so scanning from the latest back can stop at the first one older
// than a window: a router with peers deciding steadily looks at the few in its window, not at
// all it remembers.
func (c *concurrency) recentAt(k int) time.Time {
	return c.recent[(c.recentNext-k+concurrencyRecent)%concurrencyRecent]
}

// concurrencyRecent bounds the peer decisions remembered for counting before an own decision.
const concurrencyRecent = 256

type ownDecision struct {
	at     time.Time
	window time.Duration // this decision's burst window: the base window plus the stagger span then
	peers  int           // peer decisions received within window of at, either side
	unseen int           // of them, received within the base window after at
	wide   int           // peer decisions received within concurrencyWide × window after at
}

// concurrencyWide is how many burst windows wide the window of the local rate is.
const concurrencyWide = 10

type seenDecision struct {
	key uint64
	at  time.Time
}

// settle folds every own decision whose wide window has closed at now into the averages.
func (c *concurrency) settle(now time.Time) {
	for c.n > 0 && now.Sub(c.own[c.head].at) > concurrencyWide*c.own[c.head].window {
		c.fold(now)
	}
}

// fold moves the oldest own decision into the averages. One folded early (more own decisions
// than the buffer holds within a wide window) has its wide count scaled up to the whole window.
func (c *concurrency) fold(now time.Time) {
	o := &c.own[c.head]
	wide := float64(o.wide)
	if ww, el := concurrencyWide*o.window, now.Sub(o.at); el > o.window && el < ww {
		wide *= float64(ww) / float64(el)
	}
	c.est += concurrencyAlpha * (float64(o.unseen) - c.est)
	c.burst += concurrencyAlpha * (float64(o.peers) - c.burst)
	c.wide += concurrencyAlpha * (wide - c.wide)
	c.head = (c.head + 1) % concurrencyOwn
	c.n--
}

// ownDecision notes one of this router's decisions at now, taken with a stagger over span
// (Decider.AdmissionWait): its burst's decisions fall within span plus the window on either side,
// those received before it too.
func (c *concurrency) ownDecision(now time.Time, span time.Duration) {
	c.settle(now)
	if c.n == concurrencyOwn {
		c.fold(now)
	}
	w := c.window + span
	before := 0
	for k := 1; k <= c.recentLen; k++ {
		r := c.recentAt(k)
		if now.Sub(r) > w {
			break // the rest are older
		}
		if !r.After(now) {
			before++
		}
	}
	c.own[(c.head+c.n)%concurrencyOwn] = ownDecision{at: now, window: w, peers: before}
	c.n++
}

// peerDecision notes a peer's decision packet received at now: hashes from offset on of a
// request's chain routed to node. A packet continuing the previous one (same peer, node and
// instant, offset at its end) is the same decision; a packet repeating a first hash this peer
// sent for this node within ttl is a refresh of a pending request, not a new decision.
// It reports whether the packet continues the previous one and whether it is a refresh.
func (c *concurrency) peerDecision(peer, node string, offset int, hashes []uint64, now time.Time, ttl time.Duration) (cont, refresh bool) {
	cont = peer == c.lastPeer && node == c.lastNode && now.Equal(c.lastAt) && offset == c.lastEnd && offset > 0
	c.lastPeer, c.lastNode, c.lastEnd, c.lastAt = peer, node, offset+len(hashes), now
	if cont || len(hashes) == 0 {
		return cont, false
	}
	key := mix64(nodeIDHash(peer) ^ mix64(nodeIDHash(node)^mix64(hashes[0])))
	s := &c.seen[key%concurrencySeen]
	refresh = s.key == key && now.Sub(s.at) < ttl
	s.key, s.at = key, now
	if refresh {
		return false, true
	}
	c.settle(now)
	for i := 0; i < c.n; i++ {
		if o := &c.own[(c.head+i)%concurrencyOwn]; now.After(o.at) {
			o.wide++
			if now.Sub(o.at) <= o.window {
				o.peers++
			}
			if now.Sub(o.at) <= c.window {
				o.unseen++
			}
		}
	}
	c.recent[c.recentNext] = now
	c.recentNext = (c.recentNext + 1) % concurrencyRecent
	c.recentLen = min(c.recentLen+1, concurrencyRecent)
	return false, false
}

// estimate is the expected number of peer decisions taken unseen beside one at now.
func (c *concurrency) estimate(now time.Time) float64 {
	c.settle(now)
	return c.est
}

// burstSize is the expected number of peer decisions in the same burst as one at now.
func (c *concurrency) burstSize(now time.Time) float64 {
	c.settle(now)
	return c.burst
}

// burstStart is when the burst that now belongs to began: the earliest decision, this router's
// or a peer's (as received), within the base window plus span before now; now when there is none.
func (c *concurrency) burstStart(now time.Time, span time.Duration) time.Time {
	from, start := now.Add(-(c.window + span)), now
	for k := 1; k <= c.recentLen; k++ {
		r := c.recentAt(k)
		if r.Before(from) {
			break // the rest are older
		}
		if r.Before(start) {
			start = r
		}
	}
	for i := 0; i < c.n; i++ {
		if at := c.own[(c.head+i)%concurrencyOwn].at; at.Before(start) && !at.Before(from) {
			start = at
		}
	}
	return start
}

// burstRatio is how many times more peer decisions must fall within a decision's burst window
// (span plus the window, either side) than its share of the wide window's (what decisions
// arriving at random at the local rate would put there) for the router to be in bursts.
const burstRatio = 2

// bursting reports whether decisions come in bursts: the burst average is at least
// SpreadMinConcurrency and burstRatio times its share of the wide average. Fast smooth traffic
// has many peer decisions near each own one, but no more than its local rate says.
func (c *concurrency) bursting(now time.Time) bool {
	b := c.burstSize(now)
	random := c.wide * 2 / concurrencyWide
	return b >= SpreadMinConcurrency && b >= burstRatio*random
}

// DefaultAdmissionSlot is the wait per router ahead in the stagger (Decider.AdmissionWait): a few share
// latencies, so that a router's decisions reach the next one, with the load they carry, before
// it decides.
const DefaultAdmissionSlot = 5 * time.Millisecond

// MaxAdmissionDelay bounds the stagger: beyond 20 routers the slot shrinks to fit.
const MaxAdmissionDelay = 100 * time.Millisecond

// admissionSpan is the stagger's span with peers other routers: the last one's wait.
func admissionSpan(peers int, slot time.Duration) time.Duration {
	if peers <= 0 || slot <= 0 {
		return 0
	}
	return min(time.Duration(peers)*slot, MaxAdmissionDelay)
}

// admissionDelay is the wait of the router ranked rank (0 first) among peers + 1 routers.
func admissionDelay(rank, peers int, slot time.Duration) time.Duration {
	if rank <= 0 || peers <= 0 {
		return 0
	}
	return admissionSpan(peers, slot) * time.Duration(rank) / time.Duration(peers)
}
