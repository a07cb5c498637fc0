// Package kvpool is a fixed-size pool of KV-cache blocks driven by a local.PrefixCache exactly as
// an inference engine drives it (local/CONTRACT.md, "The caller's contract"): every block has a
// reference count (one per running sequence that uses it plus one per time the cache stores it)
// and a block whose count drops to zero returns to a free list. Admit looks the prompt up, reuses
// the matched blocks, reclaims room under pressure the way the engine's reclaim_for_prompt does
// (local/CONTRACT.md, "PinPrefix": pin the cached prefix, evict unheld leaves until enough blocks
// are free or nothing is left, unpin) and allocates the rest for the prompt and its output;
// Insert hands the prompt's block table to the cache after prefill and applies InsertAcquired
// (increments before decrements); Finish releases the sequence's holds. Costs turns token counts
// into simulated prefill, load and decode durations, for the live simulated engine and the trace
// simulator alike. CPUTier is a CPU KV tier as vLLM's OffloadingConnector keeps one (whole chunks,
// LRU, looked up to continue the GPU prefix) and SpillCache the tree wrapper that spills the
// chunks the pool's GPU blocks lose into it, so both simulators model offloading with the same
// code (cputier.go, spill.go). The package is pure: no IO, no goroutines, no clock, and a Pool is not safe for
// concurrent use (its owner serialises calls; the cache itself may be shared with other readers).
package kvpool

import (
	"errors"
	"fmt"

	"github.com/prefixmesh/prefixmesh/local"
)

// Errors returned by Admit and the Seq methods.
var (
	// ErrTooLarge: the prompt plus its output needs more blocks than the whole pool holds.
	ErrTooLarge = errors.New("kvpool: request needs more blocks than the pool has")
	// ErrPoolBusy: the request would fit an idle pool, but blocks held by running sequences
	// (or prefixes pinned in the cache by someone else) leave too little room now; retry after
	// a sequence finishes.
	ErrPoolBusy = errors.New("kvpool: not enough free blocks now")
	// ErrInvalid: a negative output length.
	ErrInvalid = errors.New("kvpool: invalid argument")
	// ErrFinished: the sequence was already finished.
	ErrFinished = errors.New("kvpool: sequence already finished")
	// ErrInserted: the sequence was already inserted into the cache.
	ErrInserted = errors.New("kvpool: sequence already inserted")
)

// MaxBlocks bounds the pool size: block ids are uint32 and local.NoBlock (2^32−1) is reserved,
// and a larger pool would not fit in memory of any GPU anyway.
const MaxBlocks = 1 << 30

// Pool is a fixed set of KV blocks numbered 0..N-1 plus the cache that indexes them.
type Pool struct {
	cache     local.PrefixCache
	blockSize int
	refs      []int32  // per block: sequences' refs + cache's refs
	free      []uint32 // stack of blocks with refs == 0; the top is the next allocated
	stats     Stats
}

// Stats are counters and levels of a pool.
type Stats struct {
	Blocks       int    // N, the pool size
	Free         int    // blocks with no reference
	Running      int    // admitted, not yet finished sequences
	Admitted     uint64 // sequences admitted so far
	ReusedBlocks uint64 // blocks taken from the cache by Admit
	EvictedCalls uint64 // Evict calls made while reclaiming
	Evicted      uint64 // blocks the cache evicted while reclaiming
	// Violations counts cache results that broke the contract (a block id outside the pool, or
	// a reference dropped below zero); such results are ignored. Always 0 with a correct cache
	// that no one else evicts from.
	Violations uint64
}

// New returns a pool of numBlocks blocks of blockSize tokens indexed by cache. The cache should
// start empty (or hold only blocks of an earlier pool of the same size that was never handed
// back), and nobody else may call Evict or Insert on it: the results carry block references only
// this pool can apply.
func New(cache local.PrefixCache, numBlocks, blockSize int) (*Pool, error) {
	switch {
	case cache == nil:
		return nil, fmt.Errorf("%w: nil cache", ErrInvalid)
	case numBlocks <= 0 || numBlocks > MaxBlocks:
		return nil, fmt.Errorf("%w: numBlocks %d outside 1..%d", ErrInvalid, numBlocks, MaxBlocks)
	case blockSize <= 0:
		return nil, fmt.Errorf("%w: blockSize %d must be positive", ErrInvalid, blockSize)
	}
	p := &Pool{
		cache:     cache,
		blockSize: blockSize,
		refs:      make([]int32, numBlocks),
		free:      make([]uint32, numBlocks),
	}
	for i := range p.free {
		p.free[i] = uint32(numBlocks - 1 - i) // block 0 on top: allocation order 0, 1, 2, …
	}
	p.stats.Blocks = numBlocks
	return p, nil
}

// BlockSize is the number of tokens per block.
func (p *Pool) BlockSize() int { return p.blockSize }

// BlocksFor is the number of blocks a sequence of promptTokens + outputTokens tokens occupies.
func (p *Pool) BlocksFor(promptTokens, outputTokens int) int {
	return (promptTokens + outputTokens + p.blockSize - 1) / p.blockSize
}

// Fits reports whether such a sequence could ever be admitted, i.e. whether Admit would not
// return ErrTooLarge.
func (p *Pool) Fits(promptTokens, outputTokens int) bool {
	return outputTokens >= 0 && p.BlocksFor(promptTokens, outputTokens) <= len(p.refs)
}

// Stats returns the pool's counters.
func (p *Pool) Stats() Stats {
	s := p.stats
	s.Free = len(p.free)
	return s
}

// Seq is an admitted sequence: its block table (reused prefix blocks, then new blocks for the
// rest of the prompt and the output) and its holds on the cache.
type Seq struct {
	pool     *Pool
	tokens   []uint32 // the prompt; owned by the caller, must not change until Finish
	adapter  uint64
	blocks   []uint32
	matched  int // tokens reused, block-aligned, = len(reused blocks) · blockSize
	lookedUp int // MatchedTokens of the Lookup, what ReleaseMatched must roll back
	inserted bool
	finished bool
}

// MatchedTokens is the number of prompt tokens whose KV blocks came from the cache (a multiple
// of the block size): the engine's cached_tokens.
func (s *Seq) MatchedTokens() int { return s.matched }

// PromptTokens is the prompt length.
func (s *Seq) PromptTokens() int { return len(s.tokens) }

// Blocks returns a copy of the sequence's block table.
func (s *Seq) Blocks() []uint32 { return append([]uint32(nil), s.blocks...) }

// Inserted reports whether Insert has run.
func (s *Seq) Inserted() bool { return s.inserted }

// Finished reports whether Finish has run.
func (s *Seq) Finished() bool { return s.finished }

// Admit admits a sequence with prompt tokens under adapter that will produce outputTokens tokens.
// The pool keeps tokens until Finish; the caller must not modify them. It returns ErrTooLarge if
// the sequence can never fit and ErrPoolBusy if it cannot fit now; either way nothing is held.
func (p *Pool) Admit(tokens []uint32, adapter uint64, outputTokens int) (*Seq, error) {
	if outputTokens < 0 {
		return nil, fmt.Errorf("%w: outputTokens %d", ErrInvalid, outputTokens)
	}
	need := p.BlocksFor(len(tokens), outputTokens)
	if need > len(p.refs) {
		return nil, fmt.Errorf("%w: %d blocks for %d+%d tokens, pool has %d",
			ErrTooLarge, need, len(tokens), outputTokens, len(p.refs))
	}
	bs := p.blockSize

	// Reclaim (the engine's reclaim_for_prompt): pin the cached prefix so eviction cannot take the
	// blocks this sequence is about to reuse, evict for the rest, drop the pin. Pinning rather
	// than looking up first keeps a refused request out of the cache's hit counters.
	if len(p.free) < need {
		pinned := p.cache.PinPrefix(tokens, bs, adapter)
		target := need - pinned/bs
		p.reclaim(target)
		if pinned > 0 {
			p.cache.ReleaseMatched(tokens, bs, pinned, adapter)
		}
		if len(p.free) < target {
			return nil, fmt.Errorf("%w: need %d new blocks, %d free", ErrPoolBusy, target, len(p.free))
		}
	}

	m := p.cache.Lookup(tokens, bs, 0, adapter)
	// With sub-block matching on, a match may end inside a block; that block cannot be shared
	// without copy-on-write (local/CONTRACT.md, "Sub-block matching"), so only whole blocks are reused. Lookup held only those.
	reuse := min(m.MatchedTokens/bs, len(m.MatchedBlocks))
	fresh := need - reuse
	if fresh > len(p.free) {
		// Unreachable when this pool is the cache's only user (the pin and the lookup see the
		// same state); possible if someone else released a pin in between. Reclaim once more.
		p.reclaim(fresh)
		if fresh > len(p.free) {
			if m.MatchedTokens > 0 {
				p.cache.ReleaseMatched(tokens, bs, m.MatchedTokens, adapter)
			}
			return nil, fmt.Errorf("%w: need %d new blocks, %d free", ErrPoolBusy, fresh, len(p.free))
		}
	}

	s := &Seq{
		pool:     p,
		tokens:   tokens,
		adapter:  adapter,
		blocks:   make([]uint32, 0, need),
		matched:  reuse * bs,
		lookedUp: m.MatchedTokens,
	}
	for _, b := range m.MatchedBlocks[:reuse] {
		if !p.valid(b) || p.refs[b] <= 0 {
			// The cache handed out a block it does not hold: a contract break (a block
			// on the free list would be handed out twice). Count it; take a fresh block.
			p.stats.Violations++
			b = p.pop()
		} else {
			p.refs[b]++
			p.stats.ReusedBlocks++
		}
		s.blocks = append(s.blocks, b)
	}
	for len(s.blocks) < need {
		s.blocks = append(s.blocks, p.pop())
	}
	p.stats.Running++
	p.stats.Admitted++
	return s, nil
}

// Insert hands the prompt's blocks to the cache after prefill and applies the result (local/CONTRACT.md,
// "The caller's contract", item 2): a ref on every acquired block before dropping one on every released block, so a block
// in both lists never passes through zero.
func (s *Seq) Insert() error {
	switch {
	case s.finished:
		return ErrFinished
	case s.inserted:
		return ErrInserted
	}
	p := s.pool
	promptBlocks := (len(s.tokens) + p.blockSize - 1) / p.blockSize
	acq := p.cache.Insert(s.tokens, s.blocks[:promptBlocks], nil, p.blockSize, s.matched, s.adapter)
	for _, b := range acq.Blocks {
		if p.valid(b) {
			if p.refs[b] == 0 {
				p.stats.Violations++ // the cache took a block no sequence gave it
				p.take(b)
			}
			p.refs[b]++
		} else {
			p.stats.Violations++
		}
	}
	for _, b := range acq.ReleasedBlocks {
		p.dec(b)
	}
	s.inserted = true
	return nil
}

// Finish ends the sequence: it drops the sequence's holds on the cache (Release of the inserted
// prompt, or ReleaseMatched of the lookup when it never inserted) and its own refs on
// its blocks; blocks left with no reference return to the free list. The cache keeps its own
// refs on the blocks it stores until they are evicted.
func (s *Seq) Finish() error {
	if s.finished {
		return ErrFinished
	}
	p := s.pool
	switch {
	case s.inserted:
		p.cache.Release(s.tokens, p.blockSize, s.adapter)
	case s.lookedUp > 0:
		p.cache.ReleaseMatched(s.tokens, p.blockSize, s.lookedUp, s.adapter)
	}
	for _, b := range s.blocks {
		p.dec(b)
	}
	s.finished = true
	s.blocks = nil
	p.stats.Running--
	return nil
}

// Reclaim evicts unheld cached blocks until at least want blocks are free or the cache has
// nothing left to evict, and returns the number of free blocks. Reclaim(Stats().Blocks) empties
// the cache of everything no sequence holds.
func (p *Pool) Reclaim(want int) int {
	p.reclaim(want)
	return len(p.free)
}

// reclaim loops evict(target − free) until target blocks are free or evict returns nothing,
// handing back the cache's ref on every evicted block. An evicted block still used by
// a running sequence stays allocated, so the loop may call Evict several times.
func (p *Pool) reclaim(target int) {
	for len(p.free) < target {
		ev := p.cache.Evict(target - len(p.free))
		p.stats.EvictedCalls++
		if ev.IsEmpty() {
			return
		}
		p.stats.Evicted += uint64(ev.Len())
		for _, b := range ev.Physical {
			p.dec(b)
		}
	}
}

func (p *Pool) valid(b uint32) bool { return int64(b) < int64(len(p.refs)) }

// pop allocates the top free block with one ref. Callers have checked there is one.
func (p *Pool) pop() uint32 {
	b := p.free[len(p.free)-1]
	p.free = p.free[:len(p.free)-1]
	p.refs[b] = 1
	return b
}

// take removes block b from the free list (only on a contract violation; O(free)).
func (p *Pool) take(b uint32) {
	for i, f := range p.free {
		if f == b {
			p.free = append(p.free[:i], p.free[i+1:]...)
			return
		}
	}
}

// dec drops one ref on b and frees it at zero.
func (p *Pool) dec(b uint32) {
	if !p.valid(b) || p.refs[b] <= 0 {
		p.stats.Violations++
		return
	}
	p.refs[b]--
	if p.refs[b] == 0 {
		p.free = append(p.free, b)
	}
}

// Check verifies the pool's structural invariants: every free block has no reference, no block
// is on the free list twice, and free plus referenced blocks make up the whole pool.
func (p *Pool) Check() error {
	onFree := make([]bool, len(p.refs))
	for _, b := range p.free {
		switch {
		case !p.valid(b):
			return fmt.Errorf("free list holds block %d outside the pool", b)
		case onFree[b]:
			return fmt.Errorf("block %d is on the free list twice", b)
		case p.refs[b] != 0:
			return fmt.Errorf("block %d is free with %d refs", b, p.refs[b])
		}
		onFree[b] = true
	}
	for b, r := range p.refs {
		if r < 0 {
			return fmt.Errorf("block %d has %d refs", b, r)
		}
		if r == 0 && !onFree[b] {
			return fmt.Errorf("block %d has no refs but is not free (leak)", b)
		}
	}
	return nil
}
