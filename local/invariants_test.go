package local

import (
	"fmt"
	"slices"
)

// toks returns the tokens from, from+1, …, to-1.
func toks(from, to uint32) []uint32 {
	out := make([]uint32, 0, to-from)
	for x := from; x < to; x++ {
		out = append(out, x)
	}
	return out
}

// cat concatenates token lists.
func cat(parts ...[]uint32) []uint32 {
	var out []uint32
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// checkStructure verifies the tree's internal bookkeeping: arena links, the hash map, the token
// slab, the evictable-leaf heap (exactly the candidates, heap-ordered), visibility flags (exactly
// the nodes walk can reach), the live count, and that the summary equals the visible set.
func checkStructure(t *RadixTree) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	live := 0
	freed := make([]bool, len(t.nodes))
	for _, f := range t.freeNodes {
		if freed[f] {
			return fmt.Errorf("node %d freed twice", f)
		}
		freed[f] = true
	}
	visible := 0
	for i := range t.nodes {
		c := int32(i)
		n := &t.nodes[i]
		if n.flags&flagLive == 0 {
			if !freed[c] {
				return fmt.Errorf("dead node %d not on the free list", c)
			}
			continue
		}
		if freed[c] {
			return fmt.Errorf("live node %d on the free list", c)
		}
		// children list
		prev := noNode
		for k := n.firstChild; k != noNode; k = t.nodes[k].nextSib {
			if t.nodes[k].parent != c || t.nodes[k].prevSib != prev || t.nodes[k].flags&flagLive == 0 {
				return fmt.Errorf("bad child link %d under %d", k, c)
			}
			prev = k
		}
		if n.flags&flagRoot != 0 {
			if n.flags&flagVisible == 0 || n.block != NoBlock || n.partial != noNode || n.heapPos >= 0 {
				return fmt.Errorf("bad root %d", c)
			}
			continue
		}
		live++
		if n.block == NoBlock {
			return fmt.Errorf("node %d stores NoBlock", c)
		}
		if got := t.children.get(t.nodes, n.hash); got != c {
			return fmt.Errorf("node %d not in the hash map", c)
		}
		p := &t.nodes[n.parent]
		if h := ChainHash(p.hash, t.slab.get(n.tokOff, n.tokLen)); h != n.hash {
			return fmt.Errorf("node %d hash %x, path gives %x", c, n.hash, h)
		}
		wantVis := n.ref > 0 && p.flags&flagVisible != 0 && (p.flags&flagRoot != 0 || p.tokLen == n.tokLen)
		if (n.flags&flagVisible != 0) != wantVis {
			return fmt.Errorf("node %d visible=%v, want %v", c, n.flags&flagVisible != 0, wantVis)
		}
		if wantVis {
			visible++
		}
		ev := n.ref <= 1 && n.firstChild == noNode
		if ev != (n.heapPos >= 0) {
			return fmt.Errorf("node %d evictable=%v but heapPos=%d", c, ev, n.heapPos)
		}
		if n.heapPos >= 0 && t.heap[n.heapPos] != c {
			return fmt.Errorf("node %d heapPos %d mismatch", c, n.heapPos)
		}
		if n.partial != noNode && t.partials[n.partial].block == NoBlock {
			return fmt.Errorf("node %d partial stores NoBlock", c)
		}
	}
	if live != t.live {
		return fmt.Errorf("live count %d, counted %d", t.live, live)
	}
	if t.children.len() != live {
		return fmt.Errorf("hash index has %d entries for %d nodes", t.children.len(), live)
	}
	filled := 0
	for _, e := range t.children.slots {
		if e != emptySlot {
			if c := slotNode(e); c < 0 || int(c) >= len(t.nodes) || t.nodes[c].hash&0xFFFFFFFF != slotTag(e) {
				return fmt.Errorf("hash index slot %#x does not match its node", e)
			}
			filled++
		}
	}
	if filled != live {
		return fmt.Errorf("hash index has %d filled slots for %d nodes", filled, live)
	}
	for i := range t.heap {
		if l := 2*i + 1; l < len(t.heap) && t.heapLess(t.heap[l], t.heap[i]) {
			return fmt.Errorf("heap order broken at %d", i)
		}
		if r := 2*i + 2; r < len(t.heap) && t.heapLess(t.heap[r], t.heap[i]) {
			return fmt.Errorf("heap order broken at %d", i)
		}
	}
	// The summary as the journal sees it.
	var snap []uint64
	for i := range t.nodes {
		if t.nodes[i].flags&(flagLive|flagRoot|flagVisible) == flagLive|flagVisible {
			snap = append(snap, t.nodes[i].hash)
		}
	}
	if len(snap) != visible {
		return fmt.Errorf("summary has %d hashes, %d visible", len(snap), visible)
	}
	return nil
}

// summaryReplica replays a tree's journal the way a router does, falling back to a snapshot when
// it falls behind, and checks every event against its current state.
type summaryReplica struct {
	set  map[uint64]bool
	seq  uint64
	buf  []SummaryEvent
	snap []uint64
}

func newSummaryReplica() *summaryReplica { return &summaryReplica{set: map[uint64]bool{}} }

// sync applies the tree's new events (or resynchronises from a snapshot) and checks the replica
// equals the tree's current snapshot.
func (r *summaryReplica) sync(t *RadixTree) error {
	var head uint64
	var ok bool
	r.buf, head, ok = t.SummarySince(r.seq, r.buf[:0])
	if !ok {
		r.snap, head = t.SummarySnapshot(r.snap[:0])
		clear(r.set)
		for _, h := range r.snap {
			r.set[h] = true
		}
		r.seq = head
	} else {
		for _, e := range r.buf {
			if e.Seq != r.seq+1 {
				return fmt.Errorf("event seq %d after %d", e.Seq, r.seq)
			}
			r.seq = e.Seq
			if e.Added == r.set[e.Hash] {
				return fmt.Errorf("event %+v: replica already has=%v", e, r.set[e.Hash])
			}
			if e.Added {
				r.set[e.Hash] = true
			} else {
				delete(r.set, e.Hash)
			}
		}
		if r.seq != head {
			return fmt.Errorf("replica at %d, head %d", r.seq, head)
		}
	}
	r.snap, head = t.SummarySnapshot(r.snap[:0])
	if head != r.seq {
		return nil // the tree moved on concurrently; checked on the next sync
	}
	if len(r.snap) != len(r.set) {
		return fmt.Errorf("replica has %d hashes, snapshot %d", len(r.set), len(r.snap))
	}
	for _, h := range r.snap {
		if !r.set[h] {
			return fmt.Errorf("snapshot hash %x missing from replica", h)
		}
	}
	return nil
}

// sortedHashes returns the snapshot's hashes sorted.
func sortedHashes(t *RadixTree) []uint64 {
	hs, _ := t.SummarySnapshot(nil)
	slices.Sort(hs)
	return hs
}
