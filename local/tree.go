package local

import "sync"

// RadixTree is the node-local prefix cache (see the package doc, CONTRACT.md and DESIGN.md). It is
// safe for concurrent use. The tree half and the snapshot half have separate locks and no method
// holds both (CONTRACT.md, "Two locks").
type RadixTree struct {
	mu sync.Mutex // guards every field below except snap and opts

	nodes     []node
	freeNodes []int32 // LIFO, like the reference's free-list, so arena indices (eviction tie-break) match
	roots     map[uint64]int32
	// children maps a node's chained hash to its arena index (index.go). A hit is confirmed by
	// comparing the parent and the block's tokens, so a 64-bit collision never returns another
	// prefix's blocks.
	children     hashIndex
	slab         tokenSlab
	partials     []partialSuffix
	freePartials []int32
	heap         []int32 // evictable leaves, min-ordered by (lastAccess, arena index): evict.go
	clock        uint64  // the LRU access counter (CONTRACT.md, "The LRU clock")
	live         int     // non-root nodes
	hits         HitStats
	journal      Journal

	// path holds the nodes of the last walk, insert or release, chunk by chunk. walk returns its
	// match there, and Insert and Release take it as a hint: the same sequence usually inserts or
	// releases right after its lookup, and a hinted node whose parent and tokens match is exactly
	// the node hashing would find, at the cost of a token compare instead of a hash (hinted).
	path  []int32
	stack []int32 // scratch: visibility cascades

	opts Options        // immutable after construction
	snap *snapshotIndex // the SSM snapshot index, with its own lock
}

var _ PrefixCache = (*RadixTree)(nil)

// NewRadixTree returns an empty tree. The zero Options are the reference's defaults.
func NewRadixTree(opts Options) *RadixTree {
	t := &RadixTree{
		opts:  opts,
		roots: make(map[uint64]int32),
		slab:  tokenSlab{limit: maxSlabTokens},
		snap:  newSnapshotIndex(opts),
	}
	t.journal.Init(opts.JournalCapacity)
	t.roots[0] = t.newRoot(0) // the base model's root is arena index 0, as in the reference
	return t
}

// IsActive reports true: callers keep KV refs in step with this cache.
func (t *RadixTree) IsActive() bool { return true }

// validInsert reports whether an insert's arguments are acceptable (CONTRACT.md, "Decisions"): a positive
// block size, a disk list that is empty or parallel to the block table, and no NoBlock among the
// block-table entries the insert would read (the full chunks it places and the partial tail's).
func validInsert(tokens, blockTable, diskBlockIDs []uint32, blockSize int) bool {
	if blockSize <= 0 {
		return false
	}
	if len(diskBlockIDs) != 0 && len(diskBlockIDs) != len(blockTable) {
		return false
	}
	full := len(tokens) / blockSize
	for _, b := range blockTable[:min(full, len(blockTable))] {
		if b == NoBlock {
			return false
		}
	}
	if len(tokens)%blockSize != 0 && len(blockTable) > full && blockTable[full] == NoBlock {
		return false
	}
	return true
}

// Lookup matches the longest cached prefix of tokens, takes one hold on each matched full block
// (release it with Release after an Insert, or ReleaseMatched), counts a hit or a miss, and then,
// only if something matched and after the tree lock is released, asks the snapshot index for the
// deepest usable SSM anchor (CONTRACT.md, "Lookup"). An invalid blockSize returns the empty match and counts
// nothing.
func (t *RadixTree) Lookup(tokens []uint32, blockSize int, sessionHash, adapterID uint64) PrefixMatch {
	var m PrefixMatch
	t.lookup(&m, tokens, blockSize, sessionHash, adapterID, false)
	return m
}

// LookupInto is Lookup writing into dst, reusing the capacity of dst's slices so a steady-state
// caller does not allocate. Every field of dst is overwritten.
func (t *RadixTree) LookupInto(dst *PrefixMatch, tokens []uint32, blockSize int, sessionHash, adapterID uint64) {
	t.lookup(dst, tokens, blockSize, sessionHash, adapterID, true)
}

func (t *RadixTree) lookup(dst *PrefixMatch, tokens []uint32, bs int, session, adapter uint64, reuse bool) {
	blocks, disks := dst.MatchedBlocks[:0], dst.MatchedDiskBlockIDs[:0]
	if !reuse {
		blocks, disks = nil, nil
	}
	*dst = PrefixMatch{}
	if bs <= 0 {
		dst.MatchedBlocks, dst.MatchedDiskBlockIDs = blocks, disks
		return
	}
	t.mu.Lock()
	w := t.walk(tokens, bs, adapter)
	if w.matched > 0 {
		t.incRefs(w.full)
		t.hits.Hits++
		t.hits.HitTokens += uint64(w.matched)
		n := w.full
		if w.hasTail {
			n++
		}
		if blocks == nil {
			blocks = make([]uint32, 0, n)
		}
		anyDisk := false
		for _, c := range t.path[:w.full] {
			blocks = append(blocks, t.nodes[c].block)
			anyDisk = anyDisk || t.nodes[c].disk != NoBlock
		}
		if w.hasTail {
			blocks = append(blocks, w.tailBlock)
			anyDisk = anyDisk || w.tailDisk != NoBlock
		}
		if anyDisk { // all-NoBlock disk lists are returned empty (CONTRACT.md, "Disk ids and NoBlock")
			if disks == nil {
				disks = make([]uint32, 0, n)
			}
			for _, c := range t.path[:w.full] {
				disks = append(disks, t.nodes[c].disk)
			}
			if w.hasTail {
				disks = append(disks, w.tailDisk)
			}
		}
	} else {
		t.hits.Misses++
	}
	t.mu.Unlock()
	dst.MatchedBlocks, dst.MatchedDiskBlockIDs, dst.MatchedTokens = blocks, disks, w.matched
	if w.matched == 0 {
		return // a tree miss never consults the snapshot index (CONTRACT.md, "Lookup")
	}
	if s, ok := t.snap.lookupTiered(tokens, w.matched, session, adapter); ok {
		if s.tiered {
			dst.HasSSMSnapshotTier, dst.SSMSnapshotTierKey, dst.SSMSnapshotTierToks = true, s.tierKey, s.tokenCount
		} else {
			dst.HasSSMSnapshot, dst.SSMSnapshot, dst.SSMSnapshotTokens = true, s.slot, s.tokenCount
		}
		dst.SSMSnapshotIsTail = s.isTail
	}
}

// PeekMatchedTokens returns what Lookup would match, without taking refs, touching LRU order,
// counting, or consulting the snapshot index (CONTRACT.md, "PeekMatchedTokens"). It does not allocate.
func (t *RadixTree) PeekMatchedTokens(tokens []uint32, blockSize int, adapterID uint64) int {
	if blockSize <= 0 {
		return 0
	}
	t.mu.Lock()
	w := t.walk(tokens, blockSize, adapterID)
	t.mu.Unlock()
	return w.matched
}

// PinPrefix holds the cached prefix of tokens like Lookup's tree half (refs and LRU recency) but
// counts nothing and skips the snapshot index (CONTRACT.md, "PinPrefix"). Release it with
// ReleaseMatched(tokens, blockSize, m, adapterID).
func (t *RadixTree) PinPrefix(tokens []uint32, blockSize int, adapterID uint64) int {
	if blockSize <= 0 {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	w := t.walk(tokens, blockSize, adapterID)
	if w.matched > 0 {
		t.incRefs(w.full)
	}
	return w.matched
}

// Release drops one hold on every full chunk of tokens present along the path (CONTRACT.md,
// "Release and ReleaseMatched").
func (t *RadixTree) Release(tokens []uint32, blockSize int, adapterID uint64) {
	t.ReleaseMatched(tokens, blockSize, len(tokens), adapterID)
}

// ReleaseMatched drops the holds of one Lookup or PinPrefix that matched matchedTokens: the first
// floor(matchedTokens / blockSize) chunks, capped at the full chunks of tokens.
func (t *RadixTree) ReleaseMatched(tokens []uint32, blockSize, matchedTokens int, adapterID uint64) {
	if blockSize <= 0 || matchedTokens < blockSize {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.decRefs(tokens, blockSize, min(matchedTokens/blockSize, len(tokens)/blockSize), adapterID)
}

// Stats returns the number of cached full blocks twice (partial suffixes and roots are not
// counted: CONTRACT.md, "Stats").
func (t *RadixTree) Stats() (entries, cachedBlocks int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.live, t.live
}

// HitStats returns this tree's lookup counters.
func (t *RadixTree) HitStats() HitStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.hits
}

// Insert caches tokens with their blocks and reports which references the caller must move
// (CONTRACT.md, "Insert" and "The caller's contract"). matchedTokens is the prefix this sequence already holds from Lookup or
// PinPrefix; every chunk at or past it gets one hold for the sequence, released by Release. Invalid
// arguments (validInsert) do nothing and return the empty result.
func (t *RadixTree) Insert(tokens, blockTable, diskBlockIDs []uint32, blockSize, matchedTokens int, adapterID uint64) InsertAcquired {
	var acq InsertAcquired
	if !validInsert(tokens, blockTable, diskBlockIDs, blockSize) {
		return acq
	}
	t.mu.Lock()
	t.insert(&acq, tokens, blockTable, diskBlockIDs, blockSize, matchedTokens, adapterID)
	t.mu.Unlock()
	return acq
}

// insert is Insert's body; t.mu is held and the arguments are valid.
func (t *RadixTree) insert(acq *InsertAcquired, tokens, bt, disks []uint32, bs, matched int, adapter uint64) {
	t.clock++
	now := t.clock
	cur := t.rootFor(adapter, true)
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
		var h uint64
		c := t.hinted(i, cur, chunk)
		if c == noNode {
			h = ChainHash(t.nodes[cur].hash, chunk)
			var collision bool
			if c, collision = t.child(cur, h, chunk); collision {
				return // a 64-bit collision: stop here, the rest stays uncached (CONTRACT.md, "Decisions")
			}
		}
		if c != noNode {
			t.setPath(i, c)
			n := &t.nodes[c]
			n.lastAccess = now
			restored := n.ref == 0
			if restored {
				n.ref = 1 // restore the cache's own ref
			}
			if owned {
				n.ref++
				if !hss && bt[i] != n.block { // block adoption (CONTRACT.md, "Insert")
					acq.ReleasedBlocks = append(acq.ReleasedBlocks, n.block)
					acq.Blocks = append(acq.Blocks, bt[i])
					n.block = bt[i]
				}
			}
			if hss && n.disk == NoBlock && disk != NoBlock {
				n.disk = disk
				acq.DiskBlockIDs = append(acq.DiskBlockIDs, disk)
			}
			if restored {
				t.show(c)
			}
			t.fixEvictable(c)
			cur = c
			continue
		}
		if p := t.nodes[cur].partial; p != noNode {
			// A new child supersedes the node's partial suffix: the cache stops holding it.
			ps := t.partials[p]
			acq.ReleasedBlocks = append(acq.ReleasedBlocks, ps.block)
			if ps.disk != NoBlock {
				acq.ReleasedDiskBlockIDs = append(acq.ReleasedDiskBlockIDs, ps.disk)
			}
			t.freePartial(cur)
		}
		ref := uint32(1)
		if owned {
			ref = 2
		}
		if acq.Blocks == nil {
			acq.Blocks = make([]uint32, 0, count-i+1) // the rest of the chain and a partial
		}
		c = t.newChild(cur, h, chunk, bt[i], disk, ref, now)
		if c == noNode {
			return // token slab full (2^32 tokens): leave the rest uncached
		}
		t.setPath(i, c)
		acq.Blocks = append(acq.Blocks, bt[i])
		if disk != NoBlock {
			acq.DiskBlockIDs = append(acq.DiskBlockIDs, disk)
		}
		cur = c
	}
	r := len(tokens) % bs
	if r == 0 || len(bt) <= full || t.nodes[cur].flags&flagRoot != 0 {
		return
	}
	// The partial tail (CONTRACT.md, "Insert"); count == full here, so cur is the last full chunk.
	pb, pd := bt[full], NoBlock
	if hss {
		pd = disks[full]
	}
	ptoks := tokens[full*bs:]
	if p := t.nodes[cur].partial; p != noNode {
		old := t.partials[p]
		off := old.tokOff
		if old.tokLen == uint32(r) {
			copy(t.slab.get(off, old.tokLen), ptoks) // the tokens are always replaced
		} else {
			var ok bool
			if off, ok = t.slab.alloc(ptoks); !ok {
				return
			}
			t.slab.free(old.tokOff, old.tokLen)
		}
		t.partials[p] = partialSuffix{tokOff: off, tokLen: uint32(r), block: pb, disk: pd}
		if old.block != pb {
			acq.Blocks = append(acq.Blocks, pb)
			acq.ReleasedBlocks = append(acq.ReleasedBlocks, old.block)
		}
		if pd != NoBlock && pd != old.disk {
			acq.DiskBlockIDs = append(acq.DiskBlockIDs, pd)
		}
		if old.disk != NoBlock && old.disk != pd {
			acq.ReleasedDiskBlockIDs = append(acq.ReleasedDiskBlockIDs, old.disk)
		}
		return
	}
	if !t.newPartial(cur, ptoks, pb, pd) {
		return
	}
	acq.Blocks = append(acq.Blocks, pb)
	if pd != NoBlock {
		acq.DiskBlockIDs = append(acq.DiskBlockIDs, pd)
	}
}

// incRefs takes one hold on each of the first n nodes of the last walk and stamps them with a new
// clock value: the nodes the reference's inc_refs would reach, since it runs under the same lock.
func (t *RadixTree) incRefs(n int) {
	t.clock++
	now := t.clock
	for _, c := range t.path[:n] {
		nd := &t.nodes[c]
		nd.ref++
		nd.lastAccess = now
		if nd.heapPos >= 0 {
			t.heapRemove(c) // now held (ref >= 2)
		}
	}
}

// decRefs drops one hold (saturating at 0) on each of the first n chunks present along the path,
// whatever their ref count.
func (t *RadixTree) decRefs(tokens []uint32, bs, n int, adapter uint64) {
	cur := t.rootFor(adapter, false)
	if cur == noNode {
		return
	}
	for i := 0; i < n; i++ {
		chunk := tokens[i*bs : (i+1)*bs]
		c := t.hinted(i, cur, chunk)
		if c == noNode {
			if c, _ = t.child(cur, ChainHash(t.nodes[cur].hash, chunk), chunk); c == noNode {
				return
			}
			t.setPath(i, c)
		}
		nd := &t.nodes[c]
		switch nd.ref {
		case 0:
		case 1:
			nd.ref = 0
			t.hide(c) // over-released: invisible to walk, with its subtree
		default:
			nd.ref--
			t.fixEvictable(c)
		}
		cur = c
	}
}

// hinted returns path[i] if it is the child of cur for chunk, else noNode. A live node with that
// parent and those tokens is the one child(cur, ChainHash(cur's hash, chunk), chunk) would return:
// its hash is that chain hash by construction and the index holds one node per hash.
func (t *RadixTree) hinted(i int, cur int32, chunk []uint32) int32 {
	if i >= len(t.path) {
		return noNode
	}
	c := t.path[i]
	n := &t.nodes[c]
	if n.parent != cur || n.flags&(flagLive|flagRoot) != flagLive || !equalTokens(t.slab.get(n.tokOff, n.tokLen), chunk) {
		return noNode
	}
	return c
}

// setPath records c as the node of chunk i.
func (t *RadixTree) setPath(i int, c int32) {
	if i < len(t.path) {
		t.path[i] = c
	} else {
		t.path = append(t.path, c)
	}
}

// rootFor returns the adapter's root, creating it when create is set (only insert creates roots).
func (t *RadixTree) rootFor(adapter uint64, create bool) int32 {
	if adapter == 0 {
		return 0
	}
	if r, ok := t.roots[adapter]; ok {
		return r
	}
	if !create {
		return noNode
	}
	r := t.newRoot(adapter)
	t.roots[adapter] = r
	return r
}
