package local

// Eviction (CONTRACT.md, "Evict") takes, one block at a time, the leaf with the smallest last_access among
// non-root leaves with ref_count <= 1 (ties: lowest arena index), re-evaluating after each
// removal so a released chain goes leaf-first in one call. The reference scans the whole arena
// per block (O(k·N)); here the candidates live in a binary min-heap keyed by (lastAccess, arena
// index) that is kept in step whenever a node's ref count, children or lastAccess change, so
// Evict(k) is O(k log N) and yields the same victims in the same order.

// evictable reports whether node c is an eviction candidate.
func (t *RadixTree) evictable(c int32) bool {
	n := &t.nodes[c]
	return n.ref <= 1 && n.firstChild == noNode && n.flags&(flagLive|flagRoot) == flagLive
}

// fixEvictable puts c into, moves it within, or takes it out of the heap after a change to its
// ref count, children or lastAccess.
func (t *RadixTree) fixEvictable(c int32) {
	in := t.nodes[c].heapPos >= 0
	switch want := t.evictable(c); {
	case want && !in:
		t.heapPush(c)
	case want && in:
		t.heapFix(t.nodes[c].heapPos)
	case !want && in:
		t.heapRemove(c)
	}
}

// Evict frees at least numBlocks blocks if there are enough candidates (one more when the last
// victim carries a partial suffix) and returns them with their real disk ids.
func (t *RadixTree) Evict(numBlocks int) EvictedBlocks {
	var out EvictedBlocks
	if numBlocks <= 0 {
		return out
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.heap) > 0 {
		out.Physical = make([]uint32, 0, min(numBlocks, len(t.heap))+1) // +1: a partial
	}
	for len(out.Physical) < numBlocks && len(t.heap) > 0 {
		c := t.heap[0]
		t.heapRemove(c)
		n := &t.nodes[c]
		if n.flags&flagVisible != 0 {
			n.flags &^= flagVisible
			t.journal.Emit(n.hash, false)
		}
		out.Physical = append(out.Physical, n.block)
		if n.disk != NoBlock {
			out.DiskBlockIDs = append(out.DiskBlockIDs, n.disk)
		}
		if p := n.partial; p != noNode {
			out.Physical = append(out.Physical, t.partials[p].block)
			if d := t.partials[p].disk; d != NoBlock {
				out.DiskBlockIDs = append(out.DiskBlockIDs, d)
			}
		}
		parent := n.parent
		t.unlink(c)
		if t.nodes[parent].flags&flagRoot == 0 {
			t.fixEvictable(parent) // may have just become a leaf
		}
	}
	return out
}

// heapLess orders candidates by (lastAccess, arena index), the reference's scan order.
func (t *RadixTree) heapLess(a, b int32) bool {
	la, lb := t.nodes[a].lastAccess, t.nodes[b].lastAccess
	return la < lb || (la == lb && a < b)
}

func (t *RadixTree) heapSet(i int, c int32) {
	t.heap[i] = c
	t.nodes[c].heapPos = int32(i)
}

func (t *RadixTree) heapPush(c int32) {
	t.heap = append(t.heap, c)
	t.nodes[c].heapPos = int32(len(t.heap) - 1)
	t.heapUp(len(t.heap) - 1)
}

func (t *RadixTree) heapRemove(c int32) {
	i := int(t.nodes[c].heapPos)
	last := len(t.heap) - 1
	if i != last {
		t.heapSet(i, t.heap[last])
	}
	t.heap = t.heap[:last]
	t.nodes[c].heapPos = -1
	if i != last {
		t.heapFix(int32(i))
	}
}

func (t *RadixTree) heapFix(i32 int32) {
	i := int(i32)
	if !t.heapDown(i) {
		t.heapUp(i)
	}
}

func (t *RadixTree) heapUp(i int) {
	c := t.heap[i]
	for i > 0 {
		p := (i - 1) / 2
		if !t.heapLess(c, t.heap[p]) {
			break
		}
		t.heapSet(i, t.heap[p])
		i = p
	}
	t.heapSet(i, c)
}

// heapDown sifts heap[i] down and reports whether it moved.
func (t *RadixTree) heapDown(i0 int) bool {
	i, n, c := i0, len(t.heap), t.heap[i0]
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && t.heapLess(t.heap[r], t.heap[l]) {
			m = r
		}
		if !t.heapLess(t.heap[m], c) {
			break
		}
		t.heapSet(i, t.heap[m])
		i = m
	}
	t.heapSet(i, c)
	return i > i0
}
