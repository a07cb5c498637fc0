package local

// The summary journal (DESIGN.md, "Visibility and the summary journal"). The summary is the set of
// chained hashes of the full-block nodes walk can reach; the node agent gossips it to routers.
//
// A node is visible when walk can reach it with some block size: its ref count is positive, its
// parent is a root or a visible node, and (below a non-root parent) its block has the parent's
// length, since one walk uses one block size. Visibility is kept as a node flag and changes only
// here: a node is created (Added), evicted (Removed), over-released 1→0 (Removed for it and every
// visible descendant, which walk can no longer reach through it) or restored 0→1 by an insert
// (Added for it and every descendant that becomes reachable again). Splits or restructuring never
// emit events (this tree has none). The journal and the tree change under the same lock, so
// SummarySnapshot is always exactly the set walk sees.

// journalEntry is one ring slot; its sequence number is implied by its position.
type journalEntry struct {
	hash  uint64
	added bool
}

// Journal is a bounded ring of the newest summary changes, each with a sequence number: the
// tree's, and the one any other summary source keeps (node/kvevents' engine-cache mirror) so that
// the gossip publisher reads every source alike. The event with sequence number s lives at
// ring[(s-1) % cap]; the ring grows by append up to cap, so a small source pays for what it uses.
// Not safe for concurrent use: its owner changes it under the same lock as what it summarises.
type Journal struct {
	ring []journalEntry
	cap  int
	head uint64 // sequence number of the newest event; 0 before the first
}

// Init sets the ring's capacity (DefaultJournalCapacity when not positive).
func (j *Journal) Init(capacity int) {
	if capacity <= 0 {
		capacity = DefaultJournalCapacity
	}
	j.cap = capacity
}

// Emit records that the block with hash h became visible (added) or invisible.
func (j *Journal) Emit(h uint64, added bool) {
	j.head++
	e := journalEntry{hash: h, added: added}
	if len(j.ring) < j.cap {
		j.ring = append(j.ring, e)
		return
	}
	j.ring[(j.head-1)%uint64(j.cap)] = e
}

// Since appends to dst every change with a sequence number greater than since, in order, and
// returns the extended slice and the newest sequence number. ok is false, and nothing is
// appended, when since has fallen out of the ring or is ahead of head.
func (j *Journal) Since(since uint64, dst []SummaryEvent) (events []SummaryEvent, head uint64, ok bool) {
	if since > j.head || j.head-since > uint64(len(j.ring)) {
		return dst, j.head, false
	}
	for s := since + 1; s <= j.head; s++ {
		e := j.ring[(s-1)%uint64(j.cap)]
		dst = append(dst, SummaryEvent{Seq: s, Hash: e.hash, Added: e.added})
	}
	return dst, j.head, true
}

// Head is the sequence number of the newest change (0 before the first).
func (j *Journal) Head() uint64 { return j.head }

// canBeVisible reports whether c would be visible given its parent's current visibility.
func (t *RadixTree) canBeVisible(c int32) bool {
	n := &t.nodes[c]
	p := &t.nodes[n.parent]
	return n.ref > 0 && p.flags&flagVisible != 0 && (p.flags&flagRoot != 0 || p.tokLen == n.tokLen)
}

// show makes c and the descendants reachable through it visible, emitting Added for each.
func (t *RadixTree) show(c int32) {
	if t.nodes[c].flags&flagVisible != 0 || !t.canBeVisible(c) {
		return
	}
	t.stack = append(t.stack[:0], c)
	for len(t.stack) > 0 {
		x := t.stack[len(t.stack)-1]
		t.stack = t.stack[:len(t.stack)-1]
		t.nodes[x].flags |= flagVisible
		t.journal.Emit(t.nodes[x].hash, true)
		for k := t.nodes[x].firstChild; k != noNode; k = t.nodes[k].nextSib {
			if t.nodes[k].flags&flagVisible == 0 && t.canBeVisible(k) {
				t.stack = append(t.stack, k)
			}
		}
	}
}

// hide makes c and its visible descendants invisible, emitting Removed for each.
func (t *RadixTree) hide(c int32) {
	if t.nodes[c].flags&flagVisible == 0 {
		return
	}
	t.stack = append(t.stack[:0], c)
	for len(t.stack) > 0 {
		x := t.stack[len(t.stack)-1]
		t.stack = t.stack[:len(t.stack)-1]
		t.nodes[x].flags &^= flagVisible
		t.journal.Emit(t.nodes[x].hash, false)
		for k := t.nodes[x].firstChild; k != noNode; k = t.nodes[k].nextSib {
			if t.nodes[k].flags&flagVisible != 0 {
				t.stack = append(t.stack, k)
			}
		}
	}
}

// SummarySince appends to dst every change with a sequence number greater than since, in order,
// and returns the extended slice and the newest sequence number. ok is false, and nothing is
// appended, when since has fallen out of the ring or is ahead of head: the caller must then take
// a SummarySnapshot and resume from its head.
func (t *RadixTree) SummarySince(since uint64, dst []SummaryEvent) (events []SummaryEvent, head uint64, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.journal.Since(since, dst)
}

// SummarySnapshot appends to dst the hash of every visible full-block node (in no particular
// order) and returns the extended slice and the sequence number it corresponds to.
func (t *RadixTree) SummarySnapshot(dst []uint64) (hashes []uint64, head uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range t.nodes {
		if t.nodes[i].flags&(flagLive|flagRoot|flagVisible) == flagLive|flagVisible {
			dst = append(dst, t.nodes[i].hash)
		}
	}
	return dst, t.journal.Head()
}

// SummaryHead returns the sequence number of the newest change (0 before the first).
func (t *RadixTree) SummaryHead() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.journal.Head()
}
