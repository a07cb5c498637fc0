package routing

import (
	"slices"
	"sync"
	"time"
)

// DefaultOverlayTTL is how long a routed request's blocks count as "expected on the node". A node
// publishes summary deltas within a few hundred milliseconds of an insert (gossip interval plus
// one prefill), so 3 s covers a slow prefill of a long prompt plus propagation with margin, while
// still bounding how long a request that failed or was evicted can mislead the router.
const DefaultOverlayTTL = 3 * time.Second

// DefaultOverlayMaxEntries bounds the overlay at 256Ki (hash, node) pairs: 100 requests/s of
// 8k-token prompts (512 blocks at 16 tokens) over a 3 s TTL is ~150k pairs, and a pair costs at
// most one map entry (≈ 32 bytes), so the bound is ~8 MiB.
const DefaultOverlayMaxEntries = 1 << 18

// overlayGenerations is the number of time buckets a TTL is cut into. Entries expire with their
// bucket, between (1 − 1/overlayGenerations) × TTL and TTL after they were recorded, so the
// overlay never outlives the TTL; an estimate costs one lookup per live bucket per block.
const overlayGenerations = 4

// ovBucket holds the pairs recorded during one TTL/overlayGenerations time slice.
type ovBucket struct {
	k     int64       // slice number: recorded at t with floor(t / width) == k
	used  bool        // false when empty and free for reuse
	words []*bitTable // like Index.words: hash → bitmask of slots per 64-slot group
	pairs int
}

// Overlay records where the router has just sent requests, so that a burst sharing a new prefix
// lands together before the chosen node's summary reports the prefix. It is kept
// apart from the node-reported Index: callers take, per node, max(index estimate, overlay
// estimate). Entries expire after at most the TTL (see overlayGenerations), which bounds how long
// the overlay can disagree with the node; once the node's own summary reports the blocks, the max
// makes the overlay redundant. Pairs live in a ring of time buckets, each a hash → node-bitmask
// map like the Index's, so expiry is dropping a bucket and an estimate is a few lookups per block.
// Requests still waiting for their first token can be held without a TTL with Begin/End
// (overlay_pending.go). Memory is bounded by maxEntries (hash, node) pairs, held or recorded;
// when full, Record and Begin expire old buckets and then refuse (and count) the rest. Safe for
// concurrent use.
type Overlay struct {
	ttl        int64 // nanoseconds, a multiple of width
	width      int64 // nanoseconds per bucket
	maxEntries int

	mu      sync.RWMutex // guards everything below
	slots   slotTable
	ring    [overlayGenerations + 1]ovBucket
	pending ovBucket  // requests between Begin and End, live until End (pending.go)
	holds   holdTable // pending requests holding each (hash, slot)
	pairs   int       // in the ring and pending, against maxEntries
	refused uint64

	scratch sync.Pool // *estimateScratch
}

// OverlayStats is a point-in-time view of the overlay.
type OverlayStats struct {
	Pairs, MaxEntries int
	Pending           int    // of Pairs, held by requests between Begin and End
	RefusedRecords    uint64 // (hash, node) pairs not recorded because the overlay was full
}

// NewOverlay returns an empty overlay. Non-positive arguments take the defaults.
func NewOverlay(ttl time.Duration, maxEntries int) *Overlay {
	if ttl <= 0 {
		ttl = DefaultOverlayTTL
	}
	if maxEntries <= 0 {
		maxEntries = DefaultOverlayMaxEntries
	}
	width := max(int64(ttl)/overlayGenerations, 1)
	return &Overlay{ttl: width * overlayGenerations, width: width, maxEntries: maxEntries, slots: newSlotTable()}
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

func (o *Overlay) live(b *ovBucket, t int64) bool { return b.used && b.k*o.width+o.ttl > t }

// Record notes that a request with these hashes was just sent to node: the overlay reports them
// as held by node for up to the TTL from now. Recording a pair again refreshes it.
func (o *Overlay) Record(node string, hashes []uint64, now time.Time) {
	if len(hashes) == 0 {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.recordLocked(node, hashes, now.UnixNano())
}

func (o *Overlay) recordLocked(node string, hashes []uint64, t int64) {
	k := floorDiv(t, o.width)
	b := &o.ring[int(((k%int64(len(o.ring)))+int64(len(o.ring)))%int64(len(o.ring)))]
	switch {
	case !b.used || b.k < k:
		o.resetBucket(b)
		b.k, b.used = k, true
	case b.k > k:
		// now is more than a TTL behind what was already recorded: it would be expired anyway.
		o.refused += uint64(len(hashes))
		return
	}
	slot, _ := o.slots.acquire(node)
	for len(b.words) <= int(slot>>6) {
		b.words = append(b.words, &bitTable{})
	}
	m, bit := b.words[slot>>6], uint64(1)<<(uint(slot)&63)
	expired := false
	for i, h := range hashes {
		w := m.get(h)
		if w&bit != 0 {
			continue
		}
		if o.pairs >= o.maxEntries && !expired {
			o.expireLocked(t)
			expired = true
		}
		if o.pairs >= o.maxEntries {
			// Only a leading run counts, so the rest of this chain is useless: refuse it whole.
			o.refused += uint64(len(hashes) - i)
			return
		}
		m.set(h, w|bit)
		b.pairs++
		o.pairs++
	}
}

// Estimate raises matchedBlocks[i] to the leading run of blocks nodes[i] holds in the index or
// the overlay together, given that the index holds its first matchedBlocks[i] (callers pass in
// the index's estimate; it never lowers it). A record may therefore hold only the part of a
// chain beyond what the node already reported — what a peer router shares — and still extend
// the index's run. It walks the chain once with a shrinking candidate set, like Index.Estimate,
// looking blocks up only for nodes whose index run has ended, and does not allocate in steady
// state.
func (o *Overlay) Estimate(hashes []uint64, nodes []string, matchedBlocks []int, now time.Time) {
	o.estimate(hashes, nodes, matchedBlocks, now, true)
}

// EstimateComputed is Estimate without the pending prefixes: only what requests that reached
// their first token computed (and peers shared), the runs a node can serve to another now.
func (o *Overlay) EstimateComputed(hashes []uint64, nodes []string, matchedBlocks []int, now time.Time) {
	o.estimate(hashes, nodes, matchedBlocks, now, false)
}

func (o *Overlay) estimate(hashes []uint64, nodes []string, matchedBlocks []int, now time.Time, pending bool) {
	matchedBlocks = matchedBlocks[:len(nodes)]
	t := now.UnixNano()
	o.mu.RLock()
	defer o.mu.RUnlock()
	var liveIdx [overlayGenerations + 2]*ovBucket
	nLive := 0
	if pending && o.pending.pairs > 0 {
		liveIdx[nLive] = &o.pending
		nLive++
	}
	for i := range o.ring {
		if b := &o.ring[i]; b.pairs > 0 && o.live(b, t) {
			liveIdx[nLive] = b
			nLive++
		}
	}
	if nLive == 0 {
		return
	}
	sc, _ := o.scratch.Get().(*estimateScratch)
	if sc == nil {
		sc = new(estimateScratch)
	}
	defer o.scratch.Put(sc)
	words := o.slots.words()
	sc.reset(words, len(o.slots.ids), len(nodes))
	sc.ahead = grow(sc.ahead, words)
	clear(sc.ahead)
	sc.order = sc.order[:0]
	alive, ahead := sc.alive, sc.ahead
	live := false
	n := len(hashes)
	for i, s := range sc.slotsOf(&o.slots, nodes) {
		if s < 0 || matchedBlocks[i] >= n {
			sc.parked[i] = -1
			continue
		}
		sc.parked[i] = s
		st := max(matchedBlocks[i], 0)
		sc.drop[s] = int32(st)
		alive[s>>6] |= 1 << (uint(s) & 63)
		if st > 0 {
			ahead[s>>6] |= 1 << (uint(s) & 63)
			sc.order = append(sc.order, slotStart{start: int32(st), slot: s})
		}
		live = true
	}
	// Nodes leave the ahead set in order of their index runs' ends: sorted once, O(k log k).
	slices.SortFunc(sc.order, func(a, b slotStart) int { return int(a.start - b.start) })
	next := 0 // sc.order[next:] are still ahead
	nextDrop := n
	if len(sc.order) > 0 {
		nextDrop = int(sc.order[0].start)
	}
	for b := 0; live && b < n; {
		active := false
		for g, a := range alive {
			if a&^ahead[g] != 0 {
				active = true
				break
			}
		}
		if active {
			h := hashes[b]
			live = false
			for g, a := range alive {
				if a == 0 {
					continue
				}
				live = true
				act := a &^ ahead[g]
				if act == 0 {
					continue
				}
				p := uint64(0)
				for _, bk := range liveIdx[:nLive] {
					if g < len(bk.words) {
						p |= bk.words[g].get(h)
					}
				}
				for gone := act &^ p; gone != 0; gone &= gone - 1 {
					sc.drop[g*64+trailingZeros(gone)] = int32(b)
				}
				alive[g] = a &^ (act &^ p)
			}
			b++
		} else {
			b = nextDrop // every live node is still inside its index run: skip to the first end
		}
		for next < len(sc.order) && int(sc.order[next].start) <= b {
			s := sc.order[next].slot
			ahead[s>>6] &^= 1 << (uint(s) & 63)
			next++
		}
		if next < len(sc.order) {
			nextDrop = int(sc.order[next].start)
		} else {
			nextDrop = n
		}
	}
	for g, a := range alive {
		for ; a != 0; a &= a - 1 {
			sc.drop[g*64+trailingZeros(a)] = int32(n)
		}
	}
	for i, s := range sc.parked {
		if s >= 0 && int(sc.drop[s]) > matchedBlocks[i] {
			matchedBlocks[i] = int(sc.drop[s])
		}
	}
}

// Expire drops every bucket that has expired at now. Daemons call it periodically (every
// TTL/overlayGenerations keeps memory tight); Record also calls it when the overlay is full.
func (o *Overlay) Expire(now time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.expireLocked(now.UnixNano())
}

func (o *Overlay) expireLocked(t int64) {
	for i := range o.ring {
		if b := &o.ring[i]; b.used && !o.live(b, t) {
			o.resetBucket(b)
		}
	}
}

// resetBucket empties b, keeping its maps' memory for the next slice. Callers hold mu.
func (o *Overlay) resetBucket(b *ovBucket) {
	for _, m := range b.words {
		m.reset()
	}
	o.pairs -= b.pairs
	b.pairs, b.used = 0, false
}

// ForgetNode drops everything recorded for node (it left, restarted or was drained).
func (o *Overlay) ForgetNode(node string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	slot, ok := o.slots.lookup(node)
	if !ok {
		return
	}
	o.dropPendingLocked(slot)
	bit := uint64(1) << (uint(slot) & 63)
	for i := range o.ring {
		b := &o.ring[i]
		if int(slot>>6) >= len(b.words) {
			continue
		}
		cleared := b.words[slot>>6].clearBit(bit)
		b.pairs -= cleared
		o.pairs -= cleared
	}
	o.slots.release(node)
}

// Stats returns the overlay's size and counters.
func (o *Overlay) Stats() OverlayStats {
	o.mu.RLock()
	defer o.mu.RUnlock()
	return OverlayStats{Pairs: o.pairs, Pending: o.pending.pairs, MaxEntries: o.maxEntries, RefusedRecords: o.refused}
}
