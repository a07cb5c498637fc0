package local

import "unsafe"

// walkResult is what walk matched (CONTRACT.md, "Walk"). The matched full-block nodes are t.path[:full].
type walkResult struct {
	matched   int  // tokens matched, block-aligned unless the sub-block tail matched
	full      int  // full-block nodes matched
	hasTail   bool // the sub-block arm matched (Options.SubBlockMatching only)
	tailBlock uint32
	tailDisk  uint32
}

// child returns parent's child for the chunk whose chained hash is h, or noNode. collision
// reports a different node filed under h: a 64-bit hash collision (or, equivalently for the
// caller, a chunk that cannot be placed there).
func (t *RadixTree) child(parent int32, h uint64, chunk []uint32) (c int32, collision bool) {
	c = t.children.get(t.nodes, h)
	if c == noNode {
		return noNode, false
	}
	n := &t.nodes[c]
	if n.parent != parent || !equalTokens(t.slab.get(n.tokOff, n.tokLen), chunk) {
		return noNode, true
	}
	return c, false
}

// equalTokens compares two token runs as bytes (one memequal call, vectorised by the runtime).
func equalTokens(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	if len(a) == 0 {
		return true
	}
	// The string conversions in a comparison do not allocate.
	return string(unsafe.Slice((*byte)(unsafe.Pointer(&a[0])), len(a)*4)) ==
		string(unsafe.Slice((*byte)(unsafe.Pointer(&b[0])), len(b)*4))
}

func hasPrefix(s, prefix []uint32) bool {
	return len(s) >= len(prefix) && equalTokens(s[:len(prefix)], prefix)
}

// walk follows tokens from the adapter's root through children whose ref count is positive, and
// records the matched nodes in t.path[:full]. It changes nothing else: no refs, no clock, no
// counters. t.mu must be held.
func (t *RadixTree) walk(tokens []uint32, bs int, adapter uint64) walkResult {
	var w walkResult
	cur := t.rootFor(adapter, false)
	if cur == noNode {
		return w
	}
	full := len(tokens) / bs
	for i := 0; i < full; i++ {
		chunk := tokens[i*bs : (i+1)*bs]
		// No hint here: a lookup is where a sequence's chain is hashed (and a benchmark that
		// peeks one prompt in a loop must not measure a cache of its own previous call).
		c, _ := t.child(cur, ChainHash(t.nodes[cur].hash, chunk), chunk)
		if c == noNode || t.nodes[c].ref == 0 {
			w.full, w.matched = i, i*bs
			return w
		}
		t.setPath(i, c)
		cur = c
	}
	w.full, w.matched = full, full*bs
	if r := len(tokens) - w.matched; t.opts.SubBlockMatching && r > 0 {
		t.subBlockTail(&w, cur, tokens[w.matched:], bs)
	}
	return w
}

// subBlockTail is walk's sub-block arm (CONTRACT.md, "Sub-block matching"): a match may end inside a block,
// first through a child whose block starts with the suffix (the oldest such child, so the choice
// is deterministic), else through the node's partial suffix.
func (t *RadixTree) subBlockTail(w *walkResult, cur int32, suffix []uint32, bs int) {
	found := noNode
	for c := t.nodes[cur].firstChild; c != noNode; c = t.nodes[c].nextSib {
		n := &t.nodes[c]
		// Only a block of this call's size: a block of another size is another KV layout.
		if n.ref > 0 && int(n.tokLen) == bs && hasPrefix(t.slab.get(n.tokOff, n.tokLen), suffix) {
			found = c // children are listed newest first: keep the last, the oldest
		}
	}
	if found != noNode {
		w.hasTail, w.tailBlock, w.tailDisk = true, t.nodes[found].block, t.nodes[found].disk
		w.matched += len(suffix)
		return
	}
	if p := t.nodes[cur].partial; p != noNode {
		ps := t.partials[p]
		if hasPrefix(t.slab.get(ps.tokOff, ps.tokLen), suffix) {
			w.hasTail, w.tailBlock, w.tailDisk = true, ps.block, ps.disk
			w.matched += len(suffix)
		}
	}
}
