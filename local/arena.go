package local

import "math"

// The node arena, the partial-suffix table and the token slab: flat slices indexed by int32 with
// LIFO free lists, so a cached block costs one 64-byte node plus its tokens and nothing else on
// the heap (DESIGN.md, "Memory").

// noNode is the nil arena index.
const noNode int32 = -1

// Node flags.
const (
	flagLive    uint8 = 1 << iota // the slot holds a node (not on the free list)
	flagRoot                      // an adapter's root: no block, never evicted or counted
	flagVisible                   // reachable by walk: see journal.go
)

// node is one arena slot: a full block (or an adapter root). 64 bytes; children are not stored
// per node but found through RadixTree.children by chained hash, and listed through an intrusive
// sibling list (newest first) for leaf tests, visibility cascades and the sub-block arm.
type node struct {
	hash       uint64 // canonical chained block hash of the path (hash.go); a root holds its adapter seed
	lastAccess uint64 // tree clock at the last insert or inc_refs that touched the node
	parent     int32
	firstChild int32  // newest child
	nextSib    int32  // next older sibling
	prevSib    int32  // next newer sibling
	tokOff     uint32 // the block's tokens: slab.toks[tokOff : tokOff+tokLen]
	tokLen     uint32
	block      uint32 // KV block; never NoBlock for a non-root node
	disk       uint32 // HSS disk block id or NoBlock
	ref        uint32 // the cache's own ref (1) + one per holding sequence; 0 after over-release
	heapPos    int32  // position in RadixTree.heap, or -1 when not evictable
	partial    int32  // index into RadixTree.partials, or noNode
	flags      uint8
}

// partialSuffix is a cached sequence's final, incomplete block (CONTRACT.md, "Nodes, roots and adapters"): no ref count, no hash.
type partialSuffix struct {
	tokOff, tokLen uint32
	block, disk    uint32
}

func (t *RadixTree) allocNode() int32 {
	if k := len(t.freeNodes); k > 0 {
		i := t.freeNodes[k-1]
		t.freeNodes = t.freeNodes[:k-1]
		return i
	}
	if len(t.nodes) >= math.MaxInt32 {
		return noNode
	}
	t.nodes = append(t.nodes, node{})
	return int32(len(t.nodes) - 1)
}

func (t *RadixTree) newRoot(adapter uint64) int32 {
	i := t.allocNode()
	t.nodes[i] = node{
		hash: AdapterSeed(adapter), parent: noNode, firstChild: noNode, nextSib: noNode, prevSib: noNode,
		block: NoBlock, disk: NoBlock, heapPos: -1, partial: noNode, flags: flagLive | flagRoot | flagVisible,
	}
	return i
}

// newChild links a new full-block node under parent, emits Added if walk can see it and keeps the
// evictable-leaf heap in step. It returns noNode if the arena or token slab is exhausted.
func (t *RadixTree) newChild(parent int32, h uint64, chunk []uint32, block, disk, ref uint32, now uint64) int32 {
	off, ok := t.slab.alloc(chunk)
	if !ok {
		return noNode
	}
	c := t.allocNode()
	if c == noNode {
		t.slab.free(off, uint32(len(chunk)))
		return noNode
	}
	p := &t.nodes[parent]
	t.nodes[c] = node{
		hash: h, lastAccess: now, parent: parent, firstChild: noNode, nextSib: p.firstChild, prevSib: noNode,
		tokOff: off, tokLen: uint32(len(chunk)), block: block, disk: disk, ref: ref,
		heapPos: -1, partial: noNode, flags: flagLive,
	}
	if p.firstChild != noNode {
		t.nodes[p.firstChild].prevSib = c
	}
	p.firstChild = c
	if p.heapPos >= 0 {
		t.heapRemove(parent) // no longer a leaf
	}
	t.children.put(t.nodes, c)
	t.live++
	t.show(c)
	t.fixEvictable(c)
	return c
}

// unlink removes leaf c from the tree and returns its slot to the free list.
func (t *RadixTree) unlink(c int32) {
	n := &t.nodes[c]
	if n.prevSib != noNode {
		t.nodes[n.prevSib].nextSib = n.nextSib
	} else {
		t.nodes[n.parent].firstChild = n.nextSib
	}
	if n.nextSib != noNode {
		t.nodes[n.nextSib].prevSib = n.prevSib
	}
	if n.partial != noNode {
		t.freePartial(c)
	}
	t.children.del(t.nodes, n.hash)
	t.slab.free(n.tokOff, n.tokLen)
	*n = node{parent: noNode, firstChild: noNode, nextSib: noNode, prevSib: noNode,
		block: NoBlock, disk: NoBlock, heapPos: -1, partial: noNode}
	t.freeNodes = append(t.freeNodes, c)
	t.live--
}

func (t *RadixTree) newPartial(owner int32, toks []uint32, block, disk uint32) bool {
	off, ok := t.slab.alloc(toks)
	if !ok {
		return false
	}
	ps := partialSuffix{tokOff: off, tokLen: uint32(len(toks)), block: block, disk: disk}
	var p int32
	if k := len(t.freePartials); k > 0 {
		p = t.freePartials[k-1]
		t.freePartials = t.freePartials[:k-1]
		t.partials[p] = ps
	} else {
		t.partials = append(t.partials, ps)
		p = int32(len(t.partials) - 1)
	}
	t.nodes[owner].partial = p
	return true
}

func (t *RadixTree) freePartial(owner int32) {
	p := t.nodes[owner].partial
	t.slab.free(t.partials[p].tokOff, t.partials[p].tokLen)
	t.partials[p] = partialSuffix{}
	t.freePartials = append(t.freePartials, p)
	t.nodes[owner].partial = noNode
}

// maxSlabTokens bounds the token slab: offsets are uint32 to keep a node at 64 bytes, so a tree
// holds at most 2^32 tokens (16 GiB of token ids, far beyond any KV pool). An insert that would
// pass it stops placing chunks, like a collision: the rest of that sequence stays uncached.
const maxSlabTokens = math.MaxUint32

// tokenSlab stores every node's and partial's tokens in one slice (no per-node slice header or
// allocation), with freed runs recycled per length: a tree normally sees one block size.
type tokenSlab struct {
	toks  []uint32
	runs  map[uint32][]uint32 // run length → offsets of freed runs
	limit uint64              // maxSlabTokens; lowered by tests
}

func (s *tokenSlab) alloc(src []uint32) (uint32, bool) {
	n := uint32(len(src))
	if fl := s.runs[n]; len(fl) > 0 {
		off := fl[len(fl)-1]
		s.runs[n] = fl[:len(fl)-1]
		copy(s.toks[off:off+n], src)
		return off, true
	}
	if uint64(len(s.toks))+uint64(n) > s.limit {
		return 0, false
	}
	off := uint32(len(s.toks))
	s.toks = append(s.toks, src...)
	return off, true
}

func (s *tokenSlab) free(off, n uint32) {
	if s.runs == nil {
		s.runs = make(map[uint32][]uint32)
	}
	s.runs[n] = append(s.runs[n], off)
}

func (s *tokenSlab) get(off, n uint32) []uint32 { return s.toks[off : off+n : off+n] }
