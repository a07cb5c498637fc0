package kvpool

import (
	"fmt"

	"github.com/prefixmesh/prefixmesh/local"
)

// SpillCache is the cache a Pool drives when its GPU blocks spill into a CPUTier: the node's tree,
// plus what a real engine's GPU blocks hold, so that a block the tree evicts can be copied to the
// CPU tier. For every full prompt block a sequence inserts, it keeps in that physical block's
// slot the block's tokens, canonical hash, chain position and parent (the KV a real block
// would hold, reduced to what an offload event names). When the tree evicts the last block of
// a chunk (position k·C+C−1), the chunk is gathered by following the parents back C−1 blocks
// and stored in the CPU tier. Eviction takes leaves first, so the chunk's other blocks are
// still in the tree, or were evicted in the same call and still hold their contents (a freed
// block is rewritten only when a later insert uses it). Blocks that end no chunk are not
// spilled on their own: as vLLM's connector, the tier holds only whole chunks.
//
// vLLM's connector offloads each chunk as soon as it is computed, while the request runs; this
// spills it when the GPU evicts it. A lookup sees no difference (the GPU prefix comes first and
// a block on the GPU is found there), and the tier's changes differ only in when the CPU copy
// appears.
//
// Only the pool calls it, serialised by the pool's owner; the tree itself stays shared with
// readers.
type SpillCache struct {
	*local.RadixTree
	cpu *CPUTier
	bs  int

	// Per physical GPU block b: its tokens are tokens[b·bs:(b+1)·bs].
	tokens    []uint32
	hash      []uint64 // canonical chained hash
	parentH   []uint64 // the hash of the block before it (when pos > 0)
	parentBlk []uint32 // the physical block of that parent at insert
	pos       []int32  // index of the block in its prompt
	adapter   []uint64
	full      []bool // a full prompt block (not a partial tail): spillable

	hashes []uint64 // scratch: the inserted prompt's hashes
	chunk  []uint32 // scratch: the physical blocks of the chunk being spilled
	hs     []uint64 // scratch: their hashes
	ts     []uint32 // scratch: their tokens

	broken uint64 // chunks not spilled: a parent block no longer held what the chain needs
}

var _ local.PrefixCache = (*SpillCache)(nil)

// NewSpillCache wraps tree, the cache of a Pool of gpuBlocks blocks of blockSize tokens, so that
// the chunks it evicts spill into cpu, a tier of the same block size.
func NewSpillCache(tree *local.RadixTree, cpu *CPUTier, gpuBlocks, blockSize int) (*SpillCache, error) {
	switch {
	case tree == nil || cpu == nil:
		return nil, fmt.Errorf("%w: spill cache needs a tree and a CPU tier", ErrInvalid)
	case gpuBlocks <= 0 || gpuBlocks > MaxBlocks:
		return nil, fmt.Errorf("%w: spill cache of %d GPU blocks outside 1..%d", ErrInvalid, gpuBlocks, MaxBlocks)
	case blockSize != cpu.bs:
		return nil, fmt.Errorf("%w: spill cache block size %d, CPU tier's %d", ErrInvalid, blockSize, cpu.bs)
	}
	return &SpillCache{
		RadixTree: tree,
		cpu:       cpu,
		bs:        blockSize,
		tokens:    make([]uint32, gpuBlocks*blockSize),
		hash:      make([]uint64, gpuBlocks),
		parentH:   make([]uint64, gpuBlocks),
		parentBlk: make([]uint32, gpuBlocks),
		pos:       make([]int32, gpuBlocks),
		adapter:   make([]uint64, gpuBlocks),
		full:      make([]bool, gpuBlocks),
		chunk:     make([]uint32, cpu.chunk),
		hs:        make([]uint64, cpu.chunk),
		ts:        make([]uint32, cpu.chunk*blockSize),
	}, nil
}

// Insert inserts into the tree and records the contents of the prompt's blocks.
func (c *SpillCache) Insert(tokens, blockTable, diskBlockIDs []uint32, blockSize, matchedTokens int, adapterID uint64) local.InsertAcquired {
	acq := c.RadixTree.Insert(tokens, blockTable, diskBlockIDs, blockSize, matchedTokens, adapterID)
	if blockSize == c.bs {
		c.record(tokens, blockTable, adapterID)
	}
	return acq
}

// record writes each prompt block's contents into its physical block's slot. It does not
// allocate once the hash scratch has grown to the longest prompt.
func (c *SpillCache) record(tokens, blockTable []uint32, adapter uint64) {
	bs := c.bs
	c.hashes = local.AppendBlockHashes(c.hashes[:0], tokens, bs, adapter)
	for i, b := range blockTable {
		if int64(b) >= int64(len(c.hash)) {
			continue // local.NoBlock or a contract break the pool counts
		}
		if i >= len(c.hashes) {
			c.full[b] = false // the partial tail
			continue
		}
		copy(c.tokens[int(b)*bs:(int(b)+1)*bs], tokens[i*bs:(i+1)*bs])
		c.hash[b], c.pos[b], c.adapter[b], c.full[b] = c.hashes[i], int32(i), adapter, true
		if i > 0 {
			c.parentH[b], c.parentBlk[b] = c.hashes[i-1], blockTable[i-1]
		} else {
			c.parentH[b], c.parentBlk[b] = 0, local.NoBlock
		}
	}
}

// Unspillable is the number of chunks not spilled because a block before the chunk's last no
// longer held its chain: 0 while the pool is the tree's only writer.
func (c *SpillCache) Unspillable() uint64 { return c.broken }

// Evict evicts from the tree and spills every chunk whose last block went.
func (c *SpillCache) Evict(numBlocks int) local.EvictedBlocks {
	ev := c.RadixTree.Evict(numBlocks)
	for _, b := range ev.Physical {
		c.spill(b)
	}
	return ev
}

// spill stores the chunk that ends at evicted block b, if b ends one.
func (c *SpillCache) spill(b uint32) {
	if int64(b) >= int64(len(c.hash)) || !c.full[b] {
		return
	}
	C := c.cpu.chunk
	p := int(c.pos[b])
	if (p+1)%C != 0 {
		return
	}
	cur := b
	for j := C - 1; ; j-- {
		c.chunk[j] = cur
		if j == 0 {
			break
		}
		par := c.parentBlk[cur]
		if int64(par) >= int64(len(c.hash)) || !c.full[par] || c.hash[par] != c.parentH[cur] || c.pos[par] != c.pos[cur]-1 {
			c.broken++ // unreachable while this pool is the tree's only writer
			return
		}
		cur = par
	}
	bs := c.bs
	for j, blk := range c.chunk {
		c.hs[j] = c.hash[blk]
		copy(c.ts[j*bs:(j+1)*bs], c.tokens[int(blk)*bs:(int(blk)+1)*bs])
	}
	first := c.chunk[0]
	c.cpu.Store(c.hs, c.ts, c.parentH[first], c.pos[first] > 0, c.adapter[b])
}
