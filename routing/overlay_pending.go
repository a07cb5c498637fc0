package routing

import "time"

// Pending requests: the overlay's TTL starts when a request is routed, but a request queued
// behind a long prefill queue may not compute its prompt for longer than the TTL, and until it
// does no summary reports the prefix. Under overload that hides exactly the prefixes a burst
// shares. Begin/End close the gap: Begin holds a request's hashes on its node for as long as the
// request waits for its first token, End releases the hold and records the hashes with the usual
// TTL, which then covers the summary's propagation. Callers that only use Record get the TTL
// behaviour alone.

// pendingKey is one (hash, slot) pair held by pending requests.
type pendingKey struct {
	hash uint64
	slot int32
}

// Begin notes that a request with these hashes was routed to node and has not produced its first
// token: until End or Abort, Estimate reports them as held by node. Holds are counted, so
// concurrent requests sharing a prefix each hold it. Pending pairs count against maxEntries; when
// the overlay is full the rest of the chain is refused (an under-report, never a false hit).
func (o *Overlay) Begin(node string, hashes []uint64, now time.Time) {
	if len(hashes) == 0 {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	slot, _ := o.slots.acquire(node)
	b := &o.pending
	for len(b.words) <= int(slot>>6) {
		b.words = append(b.words, &bitTable{})
	}
	m, bit := b.words[slot>>6], uint64(1)<<(uint(slot)&63)
	expired := false
	for i, h := range hashes {
		key := pendingKey{h, slot}
		if n := o.holds.get(key); n > 0 {
			o.holds.set(key, n+1)
			continue
		}
		if o.pairs >= o.maxEntries && !expired {
			o.expireLocked(now.UnixNano())
			expired = true
		}
		if o.pairs >= o.maxEntries {
			o.refused += uint64(len(hashes) - i)
			return
		}
		o.holds.set(key, 1)
		m.set(h, m.get(h)|bit)
		b.pairs++
		o.pairs++
	}
}

// End releases a Begin of the same (node, hashes) — the request produced its first token, so the
// node has inserted the prompt — and records the hashes with the TTL from now, covering the time
// until the node's summary reports them.
func (o *Overlay) End(node string, hashes []uint64, now time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.releaseLocked(node, hashes)
	if len(hashes) > 0 {
		o.recordLocked(node, hashes, now.UnixNano())
	}
}

// Abort releases a Begin without recording anything (the request failed or was cancelled before
// its first token, so the node may never cache its prompt).
func (o *Overlay) Abort(node string, hashes []uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.releaseLocked(node, hashes)
}

func (o *Overlay) releaseLocked(node string, hashes []uint64) {
	slot, ok := o.slots.lookup(node)
	if !ok || len(o.pending.words) <= int(slot>>6) {
		return
	}
	m, bit := o.pending.words[slot>>6], uint64(1)<<(uint(slot)&63)
	for _, h := range hashes {
		key := pendingKey{h, slot}
		n := o.holds.get(key)
		switch {
		case n == 0: // refused at Begin, or already released
		case n > 1:
			o.holds.set(key, n-1)
		default:
			o.holds.set(key, 0)
			m.set(h, m.get(h)&^bit) // a zero mask deletes
			o.pending.pairs--
			o.pairs--
		}
	}
}

// dropPendingLocked releases every hold of slot (ForgetNode). O(holds).
func (o *Overlay) dropPendingLocked(slot int32) {
	if int(slot>>6) >= len(o.pending.words) {
		return
	}
	m, bit := o.pending.words[slot>>6], uint64(1)<<(uint(slot)&63)
	o.holds.dropSlot(slot, func(h uint64) {
		m.set(h, m.get(h)&^bit)
		o.pending.pairs--
		o.pairs--
	})
}
