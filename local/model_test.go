package local

import (
	"fmt"
	"slices"
)

// The naive reference for model-based tests: CONTRACT.md's tree methods written the slow, obviously-correct
// way (children in insertion-ordered slices found by comparing tokens, an O(N) arena scan per
// evicted block), plus the decisions of CONTRACT.md (invalid input ignored, partial-suffix disk ids
// reported). It also mirrors the reference's arena index allocation (LIFO free list) so the
// eviction tie-break can be compared.

type mNode struct {
	toks       []uint32
	block      uint32
	disk       uint32
	ref        uint32
	lastAccess uint64
	arena      int
	root       bool
	parent     *mNode
	children   []*mNode // insertion order
	partial    *mPartial
}

type mPartial struct {
	toks        []uint32
	block, disk uint32
}

type model struct {
	subBlock  bool
	roots     map[uint64]*mNode
	rootOrder []uint64 // adapters in root creation order
	arena     []*mNode // by arena index; nil for a free slot
	next      int
	free      []int
	clock     uint64
	hits      HitStats
}

func newModel(subBlock bool) *model {
	m := &model{subBlock: subBlock, roots: map[uint64]*mNode{}}
	m.roots[0] = m.alloc(&mNode{root: true, block: NoBlock, disk: NoBlock})
	m.rootOrder = []uint64{0}
	return m
}

func (m *model) alloc(n *mNode) *mNode {
	if k := len(m.free); k > 0 {
		n.arena = m.free[k-1]
		m.free = m.free[:k-1]
	} else {
		n.arena = m.next
		m.next++
		m.arena = append(m.arena, nil)
	}
	m.arena[n.arena] = n
	return n
}

func (m *model) childOf(n *mNode, chunk []uint32) *mNode {
	for _, c := range n.children {
		if slices.Equal(c.toks, chunk) {
			return c
		}
	}
	return nil
}

type mWalk struct {
	nodes   []*mNode
	matched int
	tail    *[2]uint32 // block, disk of the sub-block arm
}

func (m *model) walk(tokens []uint32, bs int, adapter uint64) mWalk {
	var w mWalk
	cur := m.roots[adapter]
	if cur == nil || bs <= 0 {
		return w
	}
	for i := 0; i+bs <= len(tokens); i += bs {
		c := m.childOf(cur, tokens[i:i+bs])
		if c == nil || c.ref == 0 {
			return w
		}
		w.nodes = append(w.nodes, c)
		w.matched += bs
		cur = c
	}
	r := len(tokens) - w.matched
	if !m.subBlock || r <= 0 || r >= bs {
		return w
	}
	suffix := tokens[w.matched:]
	for _, c := range cur.children {
		if len(c.toks) == bs && c.ref > 0 && slices.Equal(c.toks[:r], suffix) {
			w.tail = &[2]uint32{c.block, c.disk}
			w.matched += r
			return w
		}
	}
	if p := cur.partial; p != nil && len(p.toks) >= r && slices.Equal(p.toks[:r], suffix) {
		w.tail = &[2]uint32{p.block, p.disk}
		w.matched += r
	}
	return w
}

func (m *model) incRefs(tokens []uint32, bs, matched int, adapter uint64) {
	m.clock++
	cur := m.roots[adapter]
	if cur == nil {
		return
	}
	for i := 0; i < matched/bs; i++ {
		c := m.childOf(cur, tokens[i*bs:(i+1)*bs])
		if c == nil {
			return
		}
		c.ref++
		c.lastAccess = m.clock
		cur = c
	}
}

func (m *model) decRefs(tokens []uint32, bs, matched int, adapter uint64) {
	cur := m.roots[adapter]
	if cur == nil || bs <= 0 {
		return
	}
	for i := 0; i < min(matched/bs, len(tokens)/bs); i++ {
		c := m.childOf(cur, tokens[i*bs:(i+1)*bs])
		if c == nil {
			return
		}
		if c.ref > 0 {
			c.ref--
		}
		cur = c
	}
}

func (m *model) lookup(tokens []uint32, bs int, adapter uint64) PrefixMatch {
	var pm PrefixMatch
	if bs <= 0 {
		return pm
	}
	w := m.walk(tokens, bs, adapter)
	if w.matched == 0 {
		m.hits.Misses++
		return pm
	}
	m.incRefs(tokens, bs, w.matched, adapter)
	m.hits.Hits++
	m.hits.HitTokens += uint64(w.matched)
	pm.MatchedTokens = w.matched
	for _, n := range w.nodes {
		pm.MatchedBlocks = append(pm.MatchedBlocks, n.block)
		pm.MatchedDiskBlockIDs = append(pm.MatchedDiskBlockIDs, n.disk)
	}
	if w.tail != nil {
		pm.MatchedBlocks = append(pm.MatchedBlocks, w.tail[0])
		pm.MatchedDiskBlockIDs = append(pm.MatchedDiskBlockIDs, w.tail[1])
	}
	if !slices.ContainsFunc(pm.MatchedDiskBlockIDs, func(d uint32) bool { return d != NoBlock }) {
		pm.MatchedDiskBlockIDs = nil
	}
	return pm
}

func (m *model) pin(tokens []uint32, bs int, adapter uint64) int {
	if bs <= 0 {
		return 0
	}
	w := m.walk(tokens, bs, adapter)
	if w.matched > 0 {
		m.incRefs(tokens, bs, w.matched, adapter)
	}
	return w.matched
}

func (m *model) valid(tokens, bt, disks []uint32, bs int) bool {
	if bs <= 0 || (len(disks) > 0 && len(disks) != len(bt)) {
		return false
	}
	full := len(tokens) / bs
	for i := 0; i < full && i < len(bt); i++ {
		if bt[i] == NoBlock {
			return false
		}
	}
	return !(len(tokens)%bs != 0 && len(bt) > full && bt[full] == NoBlock)
}

func (m *model) insert(tokens, bt, disks []uint32, bs, matched int, adapter uint64) InsertAcquired {
	var acq InsertAcquired
	if !m.valid(tokens, bt, disks, bs) {
		return acq
	}
	m.clock++
	cur := m.roots[adapter]
	if cur == nil {
		cur = m.alloc(&mNode{root: true, block: NoBlock, disk: NoBlock})
		m.roots[adapter] = cur
		m.rootOrder = append(m.rootOrder, adapter)
	}
	full := len(tokens) / bs
	count := min(full, len(bt))
	hss := len(disks) > 0
	for i := 0; i < count; i++ {
		chunk := tokens[i*bs : (i+1)*bs]
		owned := i*bs >= matched
		disk := NoBlock
		if hss {
			disk = disks[i]
		}
		if c := m.childOf(cur, chunk); c != nil {
			c.lastAccess = m.clock
			if c.ref == 0 {
				c.ref = 1
			}
			if owned {
				c.ref++
				if !hss && bt[i] != c.block {
					acq.ReleasedBlocks = append(acq.ReleasedBlocks, c.block)
					acq.Blocks = append(acq.Blocks, bt[i])
					c.block = bt[i]
				}
			}
			if hss && c.disk == NoBlock && disk != NoBlock {
				c.disk = disk
				acq.DiskBlockIDs = append(acq.DiskBlockIDs, disk)
			}
			cur = c
			continue
		}
		if p := cur.partial; p != nil {
			acq.ReleasedBlocks = append(acq.ReleasedBlocks, p.block)
			if p.disk != NoBlock {
				acq.ReleasedDiskBlockIDs = append(acq.ReleasedDiskBlockIDs, p.disk)
			}
			cur.partial = nil
		}
		ref := uint32(1)
		if owned {
			ref = 2
		}
		c := m.alloc(&mNode{toks: slices.Clone(chunk), block: bt[i], disk: disk, ref: ref, lastAccess: m.clock, parent: cur})
		cur.children = append(cur.children, c)
		acq.Blocks = append(acq.Blocks, bt[i])
		if hss && disk != NoBlock {
			acq.DiskBlockIDs = append(acq.DiskBlockIDs, disk)
		}
		cur = c
	}
	if len(tokens)%bs == 0 || len(bt) <= full || cur.root {
		return acq
	}
	np := &mPartial{toks: slices.Clone(tokens[full*bs:]), block: bt[full], disk: NoBlock}
	if hss {
		np.disk = disks[full]
	}
	old := cur.partial
	cur.partial = np
	if old == nil || old.block != np.block {
		acq.Blocks = append(acq.Blocks, np.block)
		if old != nil {
			acq.ReleasedBlocks = append(acq.ReleasedBlocks, old.block)
		}
	}
	oldDisk := NoBlock
	if old != nil {
		oldDisk = old.disk
	}
	if hss && np.disk != NoBlock && np.disk != oldDisk {
		acq.DiskBlockIDs = append(acq.DiskBlockIDs, np.disk)
	}
	if oldDisk != NoBlock && oldDisk != np.disk {
		acq.ReleasedDiskBlockIDs = append(acq.ReleasedDiskBlockIDs, oldDisk)
	}
	return acq
}

// candidates returns the eviction candidates, scanning the arena in index order.
func (m *model) victim() *mNode {
	var best *mNode
	for i := 0; i < m.next; i++ {
		n := m.arena[i]
		if n == nil || n.root || n.ref > 1 || len(n.children) > 0 || n.block == NoBlock {
			continue
		}
		if best == nil || n.lastAccess < best.lastAccess {
			best = n
		}
	}
	return best
}

func (m *model) evict(k int) EvictedBlocks {
	var ev EvictedBlocks
	if k <= 0 {
		return ev
	}
	for len(ev.Physical) < k {
		n := m.victim()
		if n == nil {
			break
		}
		ev.Physical = append(ev.Physical, n.block)
		ev.DiskBlockIDs = append(ev.DiskBlockIDs, n.disk)
		if n.partial != nil {
			ev.Physical = append(ev.Physical, n.partial.block)
			ev.DiskBlockIDs = append(ev.DiskBlockIDs, n.partial.disk)
		}
		p := n.parent
		p.children = slices.DeleteFunc(p.children, func(c *mNode) bool { return c == n })
		m.arena[n.arena] = nil
		m.free = append(m.free, n.arena)
	}
	ev.DiskBlockIDs = slices.DeleteFunc(ev.DiskBlockIDs, func(d uint32) bool { return d == NoBlock })
	if len(ev.DiskBlockIDs) == 0 {
		ev.DiskBlockIDs = nil
	}
	return ev
}

func (m *model) stats() int {
	n := 0
	for _, x := range m.arena {
		if x != nil && !x.root {
			n++
		}
	}
	return n
}

// visible returns the hashes walk can reach, by definition: a path of positive-ref nodes whose
// blocks all have one size.
func (m *model) visible(out map[uint64]bool) map[uint64]bool {
	clear(out)
	var rec func(n *mNode, h uint64, size int)
	rec = func(n *mNode, h uint64, size int) {
		for _, c := range n.children {
			if c.ref == 0 || (size != 0 && len(c.toks) != size) {
				continue
			}
			ch := ChainHash(h, c.toks)
			out[ch] = true
			rec(c, ch, len(c.toks))
		}
	}
	for _, a := range m.rootOrder {
		rec(m.roots[a], AdapterSeed(a), 0)
	}
	return out
}

// compare checks the tree's state node by node against the model: same nodes (by chained hash),
// same arena index, block, disk, ref, last access, partial suffix and adapter roots.
func (m *model) compare(t *RadixTree) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.clock != m.clock {
		return fmt.Errorf("clock %d, model %d", t.clock, m.clock)
	}
	if t.hits != m.hits {
		return fmt.Errorf("hits %+v, model %+v", t.hits, m.hits)
	}
	if len(t.roots) != len(m.roots) {
		return fmt.Errorf("%d roots, model %d", len(t.roots), len(m.roots))
	}
	count := 0
	var rec func(n *mNode, h uint64) error
	rec = func(n *mNode, h uint64) error {
		for _, c := range n.children {
			ch := ChainHash(h, c.toks)
			i := t.children.get(t.nodes, ch)
			if i == noNode {
				return fmt.Errorf("model node %v missing", c.toks)
			}
			x := &t.nodes[i]
			if int(i) != c.arena || x.block != c.block || x.disk != c.disk || x.ref != c.ref || x.lastAccess != c.lastAccess {
				return fmt.Errorf("node %v: tree {arena %d block %d disk %d ref %d la %d}, model {%d %d %d %d %d}",
					c.toks, i, x.block, x.disk, x.ref, x.lastAccess, c.arena, c.block, c.disk, c.ref, c.lastAccess)
			}
			if (x.partial != noNode) != (c.partial != nil) {
				return fmt.Errorf("node %v partial presence differs", c.toks)
			}
			if c.partial != nil {
				p := t.partials[x.partial]
				if p.block != c.partial.block || p.disk != c.partial.disk || !slices.Equal(t.slab.get(p.tokOff, p.tokLen), c.partial.toks) {
					return fmt.Errorf("node %v partial differs", c.toks)
				}
			}
			count++
			if err := rec(c, ch); err != nil {
				return err
			}
		}
		return nil
	}
	for a, r := range m.roots {
		ti, ok := t.roots[a]
		if !ok || int(ti) != r.arena {
			return fmt.Errorf("root of adapter %d: tree %d (%v), model %d", a, ti, ok, r.arena)
		}
		if err := rec(r, AdapterSeed(a)); err != nil {
			return err
		}
	}
	if count != t.live {
		return fmt.Errorf("tree has %d nodes, model %d", t.live, count)
	}
	return nil
}
