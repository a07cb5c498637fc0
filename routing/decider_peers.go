package routing

import (
	"slices"
	"time"
)

// What other routers tell this one (POLICIES.md, "Many routers"). Views of replicas differ only by what each
// router alone knows: its in-flight requests and the prefixes it has just routed. A sharer
// (router/peershare over memberlist; routing/sim with a delay and loss) carries two things between
// routers, and the decider folds both into every decision:
//
//   - load reports: a router's absolute in-flight counts per node (requests, prompt tokens,
//     uncached prefill tokens), sent periodically. Absolute, not deltas, so a lost report costs
//     one interval of staleness and never a drift; a peer that stops reporting is forgotten after
//     the PeerLoadTTL.
//   - decisions: "a request with these block hashes went to node k", recorded in the overlay with
//     its TTL exactly as this router's own Record. A sender may send only the part of the chain
//     beyond what k's summary already reports (Overlay.Estimate extends the index's run), so a
//     decision on a cached prefix costs a few bytes; a lost one only delays what the node's own
//     summary will say anyway. Nothing a peer says reaches the index: the node remains the only
//     authority on what it caches.

// DefaultPeerLoadTTL is how long a peer's load report counts without a refresh: sharers report
// every 100 ms while anything changes and at least every second, so 3 s is three missed
// heartbeats — a router that left or was partitioned away stops inflating loads soon after.
const DefaultPeerLoadTTL = 3 * time.Second

// maxPeers bounds the routers whose load is kept: far beyond any real deployment (the chart's
// default is 3), it bounds the memory a flood of forged router ids could take.
const maxPeers = 256

// peerLoads holds the latest load report of each peer router and their per-node sums. Not safe
// for concurrent use; the Decider's mu guards it.
type peerLoads struct {
	ttl    time.Duration
	byPeer map[peerPart]*peerReport
	n      int // peers in byPeer (their part 0)
	sums   map[string]*InFlight
	// prov is, per peer, the load of the decisions it shared since its last load report:
	// counted at decision-packet latency rather than at the next report, which replaces it.
	prov map[string]*peerReport
}

// peerPart names one packet of a peer's load report (AppendLoadParts).
type peerPart struct {
	peer string
	part int
}

type peerReport struct {
	at    time.Time
	loads []NodeInFlight
}

func newPeerLoads(ttl time.Duration) peerLoads {
	return peerLoads{ttl: ttl, byPeer: make(map[peerPart]*peerReport), sums: make(map[string]*InFlight),
		prov: make(map[string]*peerReport)}
}

func (p *peerLoads) sum(node string) InFlight {
	if s := p.sums[node]; s != nil {
		return *s
	}
	return InFlight{}
}

func (p *peerLoads) unapply(r *peerReport) {
	for _, l := range r.loads {
		if s := p.sums[l.Node]; s != nil {
			s.sub(l.InFlight)
			if s.zero() {
				delete(p.sums, l.Node)
			}
		}
	}
}

// addProvisional adds l on node to peer's load until its next load report.
func (p *peerLoads) addProvisional(peer, node string, l InFlight, at time.Time) {
	r := p.prov[peer]
	if r == nil {
		if len(p.prov) >= maxPeers {
			return
		}
		r = &peerReport{at: at}
		p.prov[peer] = r
	}
	i := 0
	for i < len(r.loads) && r.loads[i].Node != node {
		i++
	}
	if i == len(r.loads) {
		if i >= maxProvisional {
			return
		}
		r.loads = append(r.loads, NodeInFlight{Node: node})
	}
	r.loads[i].add(l)
	s := p.sums[node]
	if s == nil {
		s = new(InFlight)
		p.sums[node] = s
	}
	s.add(l)
}

// maxProvisional bounds the nodes one peer's provisional load names between two reports.
const maxProvisional = 1024

func (p *peerLoads) dropProvisional(peer string) {
	if r := p.prov[peer]; r != nil {
		p.unapply(r)
		delete(p.prov, peer)
	}
}

func (p *peerLoads) set(peer string, part, parts int, loads []NodeInFlight, at time.Time, known func(string) bool) bool {
	if part == 0 { // a new report counts every decision the peer had shared before it
		p.dropProvisional(peer)
	}
	for k, r := range p.byPeer { // a report that shrank to fewer packets: the rest are gone
		if k.peer == peer && k.part >= parts && !at.Before(r.at) {
			p.remove(k, r)
		}
	}
	key := peerPart{peer, part}
	r := p.byPeer[key]
	if r == nil {
		if len(p.byPeer) >= maxPeers*MaxLoadParts {
			return false
		}
		r = &peerReport{}
		p.byPeer[key] = r
		if part == 0 {
			p.n++
		}
	} else {
		if at.Before(r.at) {
			return true // an older report overtaken by a newer one
		}
		p.unapply(r)
	}
	r.at = at
	r.loads = r.loads[:0]
	for _, l := range loads {
		if known(l.Node) { // a node that is not (or no longer) a member is nobody's load
			r.loads = append(r.loads, l)
		}
	}
	for _, l := range r.loads {
		s := p.sums[l.Node]
		if s == nil {
			s = new(InFlight)
			p.sums[l.Node] = s
		}
		s.add(l.InFlight)
	}
	return true
}

func (p *peerLoads) forget(peer string) {
	p.dropProvisional(peer)
	for k, r := range p.byPeer {
		if k.peer == peer {
			p.remove(k, r)
		}
	}
}

func (p *peerLoads) remove(k peerPart, r *peerReport) {
	p.unapply(r)
	delete(p.byPeer, k)
	if k.part == 0 {
		p.n--
	}
}

func (p *peerLoads) peers() int { return p.n }

// rank is how many peers' ids sort before id: this router's place in the stagger.
func (p *peerLoads) rank(id string) int {
	r := 0
	for k := range p.byPeer {
		if k.part == 0 && k.peer < id {
			r++
		}
	}
	return r
}

func (p *peerLoads) expire(now time.Time) {
	for peer, r := range p.prov {
		if now.Sub(r.at) > p.ttl {
			p.dropProvisional(peer)
		}
	}
	for k, r := range p.byPeer {
		if now.Sub(r.at) > p.ttl {
			p.remove(k, r)
		}
	}
}

// SetPeerLoad replaces part (of parts, see AppendLoadParts) of what peer router said about its
// in-flight requests: together the parts list every node it has requests on (others are zero),
// as of at (the receipt time: router clocks are not trusted to agree). Entries naming a node the
// index does not hold (not a member, or gone) are dropped. It reports false when the peer table
// is full or the part numbers are out of range.
func (d *Decider) SetPeerLoad(peer string, part, parts int, loads []NodeInFlight, at time.Time) bool {
	if parts <= 0 || parts > MaxLoadParts || part < 0 || part >= parts {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.peers.set(peer, part, parts, loads, at, d.index.Has)
}

// PeerIDs appends the ids of the peer routers whose load counts, each once.
func (d *Decider) PeerIDs(dst []string) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	start := len(dst)
	for k := range d.peers.byPeer {
		if !slices.Contains(dst[start:], k.peer) {
			dst = append(dst, k.peer)
		}
	}
	return dst
}

// ForgetPeer drops a peer router's load (it left the cluster).
func (d *Decider) ForgetPeer(peer string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.peers.forget(peer)
}

// Peers returns how many peer routers' loads count.
func (d *Decider) Peers() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.peers.peers()
}

// PeerDecision records that peer routed a request with these block hashes (or the part of its
// chain beyond what the node reports, from offset on) to node at now (the receipt time): like
// this router's own Record, for the overlay's TTL, and counted towards the decisions taken
// beside this router's (concurrency.go). It reports false, recording nothing, when node is not a
// member whose summary the index holds (a forged or departed id must not take an overlay slot)
// or when offset and the hash count are out of range: offset is where the hashes start in the
// request's chain, so offset + len(hashes) is at most the longest chain a routed prompt has.
func (d *Decider) PeerDecision(peer, node string, offset int, hashes []uint64, now time.Time) bool {
	if offset < 0 || offset+len(hashes) > MaxChainBlocks || !d.index.Has(node) {
		return false
	}
	ttl := DefaultOverlayTTL
	if d.overlay != nil {
		d.overlay.Record(node, hashes, now)
		d.commits.Add(1)
		ttl = time.Duration(d.overlay.ttl)
	}
	bs := int(d.blockSize.Load())
	if bs <= 0 {
		bs = 16
	}
	d.mu.Lock()
	// Until the peer's next load report, its decision counts as load on node: the uncached
	// part it shared is the prefill it sent there.
	if cont, refresh := d.conc.peerDecision(peer, node, offset, hashes, now, ttl); !refresh {
		l := InFlight{Tokens: len(hashes) * bs, PrefillTokens: len(hashes) * bs}
		if !cont {
			l.Requests, l.Tokens = 1, l.Tokens+offset*bs
		}
		d.peers.addProvisional(peer, node, l, now)
	}
	d.mu.Unlock()
	return true
}

// MaxChainBlocks is the longest block-hash chain a routed prompt has: 1 Mi tokens (the routers'
// prompt bound) at one token per block.
const MaxChainBlocks = 1 << 20
