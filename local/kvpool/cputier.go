package kvpool

import (
	"fmt"

	"github.com/prefixmesh/prefixmesh/local"
)

// CPUTier is a CPU KV tier, what vLLM's OffloadingConnector keeps in host memory: a fixed
// number of slots, each holding one chunk of ChunkBlocks consecutive GPU blocks of one chain
// (vLLM's offloaded block, chunk k covering the prompt's blocks k·C … k·C+C−1), evicted whole by
// LRU (vllm/v1/kv_offload/lru_manager.py: prepare_store evicts the least recently used blocks
// before it stores, and touch moves a looked-up block to the recent end). Every constituent
// block's canonical chained hash (local.ChainHash) indexes its slot, so a lookup continues a GPU
// prefix block by block and stops at the first block the tier does not hold. Blocks come in only
// from the GPU pool's evictions (SpillCache) and are never removed by a load: as in vLLM, the
// CPU copy stays after its blocks are loaded back into the GPU.
//
// With recording on (SetRecording), each store and eviction is kept as a TierOp until ResetOps,
// for whoever publishes the tier's changes: the simulated engine writes them as vLLM's
// self-describing offload events, the trace simulator as the node summary's tier keys. Not safe
// for concurrent use: its owner serialises calls. Storage is preallocated; the index is a map
// sized for the capacity, and the op buffers grow to their high-water mark, so steady-state
// stores and lookups do not allocate.
type CPUTier struct {
	bs, chunk int // tokens per GPU block; GPU blocks per chunk
	slots     int // capacity in chunks

	tokens    []uint32 // slot s: tokens[s·chunk·bs : (s+1)·chunk·bs]
	hashes    []uint64 // slot s: canonical hashes hashes[s·chunk : (s+1)·chunk]
	parent    []uint64 // slot s: the hash of the block before the chunk; valid when hasParent
	hasParent []bool   // false for a chain's first chunk
	adapter   []uint64 // slot s: the LoRA adapter its hashes are seeded with

	prev, next []int32 // LRU list through the used slots; head is the most recent
	head, tail int32
	free       []int32          // unused slots
	index      map[uint64]int32 // canonical block hash → slot

	record   bool // keep ops for a publisher
	ops      []tierOp
	opHashes []uint64 // canonical hashes of the ops, in op order
	opTokens []uint32 // the stored chunks' tokens, in op order

	stored, evicted uint64 // chunks stored and evicted so far
}

// tierOp is one recorded change: a chunk stored or evicted. Its hashes are opHashes[h0:h1];
// a store's tokens are opTokens[t0:t1].
type tierOp struct {
	removed   bool
	h0, h1    int
	t0, t1    int
	parent    uint64
	hasParent bool
	adapter   uint64
}

// TierOp is one recorded change of a CPUTier, in the order it happened: a chunk stored or
// evicted. Its slices alias the tier's buffers and are valid until ResetOps.
type TierOp struct {
	Removed   bool     // an LRU eviction; otherwise a store
	Hashes    []uint64 // the chunk's canonical block hashes, in chain order
	Tokens    []uint32 // a store's ChunkTokens tokens; nil for an eviction
	Parent    uint64   // a store's hash of the block before the chunk, when HasParent
	HasParent bool     // false for a chain's first chunk (and for an eviction)
	Adapter   uint64   // the LoRA adapter the chunk's hashes are seeded with
}

// CPUTierStats are a tier's level and counters.
type CPUTierStats struct {
	Blocks  int    // GPU-sized blocks held
	Stored  uint64 // chunks stored so far
	Evicted uint64 // chunks evicted (LRU) so far
}

const noSlot int32 = -1

// NewCPUTier returns an empty tier of blocks GPU-sized blocks of blockSize tokens, held in chunks
// of chunkBlocks blocks; blocks must be a positive multiple of chunkBlocks (the tier holds whole
// chunks) and at most MaxBlocks.
func NewCPUTier(blocks, chunkBlocks, blockSize int) (*CPUTier, error) {
	switch {
	case blockSize <= 0 || chunkBlocks <= 0:
		return nil, fmt.Errorf("%w: CPU tier block size %d, chunk %d blocks must be positive", ErrInvalid, blockSize, chunkBlocks)
	case blocks <= 0 || blocks > MaxBlocks || blocks%chunkBlocks != 0:
		return nil, fmt.Errorf("%w: CPU tier of %d blocks: must be a multiple of the %d-block chunk in 1..%d", ErrInvalid, blocks, chunkBlocks, MaxBlocks)
	}
	n, chunk, bs := blocks/chunkBlocks, chunkBlocks, blockSize
	t := &CPUTier{
		bs: bs, chunk: chunk, slots: n,
		tokens:    make([]uint32, n*chunk*bs),
		hashes:    make([]uint64, n*chunk),
		parent:    make([]uint64, n),
		hasParent: make([]bool, n),
		adapter:   make([]uint64, n),
		prev:      make([]int32, n),
		next:      make([]int32, n),
		head:      noSlot,
		tail:      noSlot,
		free:      make([]int32, n),
		index:     make(map[uint64]int32, n*chunk),
	}
	for i := range t.free {
		t.free[i] = int32(n - 1 - i) // slot 0 first
	}
	return t, nil
}

// Stats returns the tier's level and counters.
func (t *CPUTier) Stats() CPUTierStats {
	return CPUTierStats{Blocks: (t.slots - len(t.free)) * t.chunk, Stored: t.stored, Evicted: t.evicted}
}

// ChunkBlocks is the number of GPU blocks in one chunk.
func (t *CPUTier) ChunkBlocks() int { return t.chunk }

// ChunkTokens is one chunk's tokens: the least vLLM's connector loads (Loadable).
func (t *CPUTier) ChunkTokens() int { return t.chunk * t.bs }

// Peek returns how many tokens past the first gpuTokens (block-aligned) of the prompt the tier
// continues the prefix, block by block, stopping at the first block it does not hold. It changes
// nothing and does not allocate: what a mirror of the tier's events answers
// (kvevents.CacheMirror.PeekMatchedTokensByTier).
func (t *CPUTier) Peek(tokens []uint32, adapter uint64, gpuTokens int) int {
	return t.continuation(tokens, adapter, gpuTokens, false)
}

// Lookup is Peek for a request being admitted: every chunk it passes becomes the most recently
// used, as vLLM's connector touches the blocks it is asked for. It does not allocate.
func (t *CPUTier) Lookup(tokens []uint32, adapter uint64, gpuTokens int) int {
	return t.continuation(tokens, adapter, gpuTokens, true)
}

// Load is what an engine admitting the prompt loads from the tier after its GPU prefix of
// gpuTokens: Loadable(Lookup(…)).
func (t *CPUTier) Load(tokens []uint32, adapter uint64, gpuTokens int) int {
	return t.Loadable(t.Lookup(tokens, adapter, gpuTokens))
}

func (t *CPUTier) continuation(tokens []uint32, adapter uint64, gpuTokens int, touch bool) int {
	bs := t.bs
	h := local.AdapterSeed(adapter)
	i := 0
	for ; i+bs <= gpuTokens && i+bs <= len(tokens); i += bs {
		h = local.ChainHash(h, tokens[i:i+bs])
	}
	n := 0
	for ; i+bs <= len(tokens); i += bs {
		h = local.ChainHash(h, tokens[i:i+bs])
		s, ok := t.index[h]
		if !ok {
			break
		}
		if touch {
			t.touch(s)
		}
		n += bs
	}
	return n
}

// Loadable is what vLLM's connector loads of a continuation of cont tokens: all of it, unless
// it is less than one chunk (OffloadingConnectorScheduler.get_num_new_matched_tokens in
// vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py returns 0 when the hit
// is under offloaded_block_size tokens), which is recomputed instead.
func (t *CPUTier) Loadable(cont int) int {
	if cont < t.ChunkTokens() {
		return 0
	}
	return cont
}

// Store puts one chunk in (hashes: its ChunkBlocks canonical block hashes, tokens: its
// ChunkTokens tokens), evicting the least recently used chunk when full. A chunk already held is
// only touched, as prepare_store skips blocks already stored.
func (t *CPUTier) Store(hashes []uint64, tokens []uint32, parent uint64, hasParent bool, adapter uint64) {
	if s, ok := t.index[hashes[len(hashes)-1]]; ok {
		t.touch(s)
		return
	}
	if len(t.free) == 0 {
		t.evictLRU()
	}
	s := t.free[len(t.free)-1]
	t.free = t.free[:len(t.free)-1]
	c, cb := int(s)*t.chunk, int(s)*t.chunk*t.bs
	copy(t.hashes[c:c+t.chunk], hashes)
	copy(t.tokens[cb:cb+t.chunk*t.bs], tokens)
	t.parent[s], t.hasParent[s], t.adapter[s] = parent, hasParent, adapter
	for _, h := range hashes {
		t.index[h] = s
	}
	t.pushFront(s)
	t.stored++
	if t.record {
		h0, t0 := len(t.opHashes), len(t.opTokens)
		t.opHashes = append(t.opHashes, hashes...)
		t.opTokens = append(t.opTokens, tokens...)
		t.ops = append(t.ops, tierOp{h0: h0, h1: len(t.opHashes), t0: t0, t1: len(t.opTokens),
			parent: parent, hasParent: hasParent, adapter: adapter})
	}
}

// evictLRU frees the least recently used chunk.
func (t *CPUTier) evictLRU() {
	s := t.tail
	t.unlink(s)
	c := int(s) * t.chunk
	for _, h := range t.hashes[c : c+t.chunk] {
		delete(t.index, h)
	}
	t.free = append(t.free, s)
	t.evicted++
	if t.record {
		h0 := len(t.opHashes)
		t.opHashes = append(t.opHashes, t.hashes[c:c+t.chunk]...)
		t.ops = append(t.ops, tierOp{removed: true, h0: h0, h1: len(t.opHashes), adapter: t.adapter[s]})
	}
}

// Holds reports whether the tier holds the block with canonical hash h.
func (t *CPUTier) Holds(h uint64) bool {
	_, ok := t.index[h]
	return ok
}

// AppendHashes appends the canonical hash of every block the tier holds, most recently used
// chunk first, each chunk's in chain order: a deterministic order, unlike the index's.
func (t *CPUTier) AppendHashes(dst []uint64) []uint64 {
	for s := t.head; s != noSlot; s = t.next[s] {
		dst = append(dst, t.hashes[int(s)*t.chunk:(int(s)+1)*t.chunk]...)
	}
	return dst
}

// SetRecording turns the recording of ops on or off; turning it off forgets what was recorded.
func (t *CPUTier) SetRecording(on bool) {
	t.record = on
	if !on {
		t.ResetOps()
	}
}

// Ops appends the ops recorded since the last ResetOps to dst, in order. The ops' slices alias
// the tier's buffers until ResetOps; with dst reused, it does not allocate in steady state.
func (t *CPUTier) Ops(dst []TierOp) []TierOp {
	for _, op := range t.ops {
		o := TierOp{Removed: op.removed, Hashes: t.opHashes[op.h0:op.h1], Parent: op.parent,
			HasParent: op.hasParent, Adapter: op.adapter}
		if !op.removed {
			o.Tokens = t.opTokens[op.t0:op.t1]
		}
		dst = append(dst, o)
	}
	return dst
}

// ResetOps forgets the recorded ops once published.
func (t *CPUTier) ResetOps() {
	t.ops, t.opHashes, t.opTokens = t.ops[:0], t.opHashes[:0], t.opTokens[:0]
}

func (t *CPUTier) touch(s int32) {
	if t.head == s {
		return
	}
	t.unlink(s)
	t.pushFront(s)
}

func (t *CPUTier) pushFront(s int32) {
	t.prev[s], t.next[s] = noSlot, t.head
	if t.head != noSlot {
		t.prev[t.head] = s
	}
	t.head = s
	if t.tail == noSlot {
		t.tail = s
	}
}

func (t *CPUTier) unlink(s int32) {
	p, n := t.prev[s], t.next[s]
	if p != noSlot {
		t.next[p] = n
	} else {
		t.head = n
	}
	if n != noSlot {
		t.prev[n] = p
	} else {
		t.tail = p
	}
	t.prev[s], t.next[s] = noSlot, noSlot
}
