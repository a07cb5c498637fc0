package kvpool

import "github.com/prefixmesh/prefixmesh/local"

// CPUTier is a CPU KV tier, what vLLM's OffloadingConnector keeps in host memory: a
// fixed number of slots, each holding one chunk of CPUChunkBlocks consecutive GPU blocks of one
// chain (vLLM's offloaded block, chunk k covering the prompt's blocks k·C … k·C+C−1), evicted
// whole by LRU (vllm/v1/kv_offload/lru_manager.py: prepare_store evicts the least recently used
// blocks before it stores, and touch moves a looked-up block to the recent end). Every
// constituent block's canonical chained hash (local.ChainHash) indexes its slot, so a lookup
// continues a GPU prefix block by block and stops at the first block the tier does not hold.
// Blocks come in only from the GPU pool's evictions (spill.go) and are never removed by a
// load: as in vLLM, the CPU copy stays after its blocks are loaded back into the GPU.
//
// With Record set, each store and eviction is recorded (Ops) for the simulated engine's next
// publish, which writes them as vLLM's self-describing offload events. Not safe for concurrent
// use: its owner serialises calls. Storage is preallocated; the index is a map
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

	Record   bool // keep ops for the event publisher
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

const noSlot int32 = -1

// NewCPUTier returns an empty tier of blocks GPU-sized blocks of bs tokens in chunks of chunk
// blocks (blocks a positive multiple of chunk).
func NewCPUTier(blocks, chunk, bs int) *CPUTier {
	n := blocks / chunk
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
	return t
}

// Blocks is the number of GPU blocks the tier holds.
func (t *CPUTier) Blocks() int { return (t.slots - len(t.free)) * t.chunk }

// ChunkTokens is one chunk's tokens: the least vLLM's connector loads (below).
func (t *CPUTier) ChunkTokens() int { return t.chunk * t.bs }

// Continuation returns how many tokens past the first gpuTokens (block-aligned) of the prompt
// the tier continues the prefix, block by block, stopping at the first block it does not hold;
// touch marks every chunk it passes as just used. It does not allocate.
func (t *CPUTier) Continuation(tokens []uint32, adapter uint64, gpuTokens int, touch bool) int {
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

// Store puts one chunk in (hashes: its chunk canonical block hashes, tokens: its chunk·bs
// tokens), evicting the least recently used chunk when full. A chunk already held is only
// touched, as prepare_store skips blocks already stored.
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
	if t.Record {
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
	if t.Record {
		h0 := len(t.opHashes)
		t.opHashes = append(t.opHashes, t.hashes[c:c+t.chunk]...)
		t.ops = append(t.ops, tierOp{removed: true, h0: h0, h1: len(t.opHashes), adapter: t.adapter[s]})
	}
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

// Stats returns the GPU-sized blocks held and the chunks stored and evicted so far.
func (t *CPUTier) Stats() (blocks int, stored, evicted uint64) {
	return t.Blocks(), t.stored, t.evicted
}

// TierOp is one recorded change, its slices aliasing the tier's buffers until ResetOps.
type TierOp struct {
	Removed   bool
	Hashes    []uint64
	Tokens    []uint32
	Parent    uint64
	HasParent bool
	Adapter   uint64
}

// Ops appends the ops recorded since ResetOps to dst, in order.
func (t *CPUTier) Ops(dst []TierOp) []TierOp {
	for _, op := range t.ops {
		dst = append(dst, TierOp{Removed: op.removed, Hashes: t.opHashes[op.h0:op.h1], Tokens: t.opTokens[op.t0:op.t1],
			Parent: op.parent, HasParent: op.hasParent, Adapter: op.adapter})
	}
	return dst
}
