package routing

import (
	"math/bits"

	"github.com/prefixmesh/prefixmesh/local"
)

func trailingZeros(x uint64) int { return bits.TrailingZeros64(x) }

// estimateScratch is the per-call working memory of Estimate and Overlay.Estimate, pooled so that
// a steady stream of estimates does not allocate.
type estimateScratch struct {
	alive  []uint64    // candidate set: bit per slot still matching every block so far
	drop   []int32     // by slot: the block index at which the slot stopped matching
	parked []int32     // by requested node: its slot, or -1 when unknown
	ahead  []uint64    // Overlay.Estimate: slots whose index run covers the current block
	order  []slotStart // Overlay.Estimate: the ahead slots by the end of their index runs

	slots idMemo[int32] // the requested nodes' slots (-1: none), remembered for the next call
}

// slotStart is a slot and the block its overlay walk starts at.
type slotStart struct {
	start, slot int32
}

// slotsOf is the slot of each of nodes in t (-1 for none).
func (s *estimateScratch) slotsOf(t *slotTable, nodes []string) []int32 {
	return s.slots.resolve(nodes, t.gen, func(id string) int32 {
		if sl, ok := t.lookup(id); ok {
			return sl
		}
		return -1
	})
}

func (s *estimateScratch) reset(words, slots, nodes int) {
	s.alive = grow(s.alive, words)
	clear(s.alive)
	s.drop = grow(s.drop, slots)
	s.parked = grow(s.parked, nodes)
}

func grow[T any](b []T, n int) []T {
	if cap(b) < n {
		return make([]T, n)
	}
	return b[:n]
}

// Estimate writes to matchedBlocks[i] the number of leading hashes nodes[i] holds consecutively —
// the node's PeekMatchedTokens divided by its block size, as of the last summary the index applied
// for it. A node the index does not know gets 0. It panics if len(matchedBlocks) < len(nodes).
//
// It walks the chain once: the candidate set starts as the requested nodes' bits and shrinks by
// one AND per 64 nodes per block; the walk stops when it is empty. That is O(nodes + blocks ×
// ceil(nodes/64)) map lookups, and it does not allocate in steady state.
//
// A node holds h[i] only if it holds the whole chain h[0..i] (a summary contains only blocks
// visible to a walk, whose ancestors are visible), so the leading run is what a peek returns.
func (x *Index) Estimate(hashes []uint64, nodes []string, matchedBlocks []int) {
	x.EstimateOnTier(hashes, local.TierGPU, nodes, matchedBlocks)
}

// EstimateOnTier is Estimate for the copies on one tier alone: the leading hashes each node holds
// on tier t from the first block (its tier keys, local.TierKey), whatever it holds on other
// tiers. For the GPU it is Estimate.
func (x *Index) EstimateOnTier(hashes []uint64, t local.Tier, nodes []string, matchedBlocks []int) {
	matchedBlocks = matchedBlocks[:len(nodes)]
	x.mu.RLock()
	defer x.mu.RUnlock()
	sc, _ := x.scratch.Get().(*estimateScratch)
	if sc == nil {
		sc = new(estimateScratch)
	}
	defer x.scratch.Put(sc)
	sc.reset(len(x.words), len(x.nodes), len(nodes))
	alive := sc.alive
	live := false
	for i, s := range sc.slotsOf(&x.slots, nodes) {
		if s < 0 {
			sc.parked[i] = -1
			continue
		}
		sc.parked[i] = s
		alive[s>>6] |= 1 << (uint(s) & 63)
		live = true
	}
	walkChain(hashes, local.TierKey(0, t), x.words, alive, sc.drop, live)
	for i, s := range sc.parked {
		if s < 0 {
			matchedBlocks[i] = 0
		} else {
			matchedBlocks[i] = int(sc.drop[s])
		}
	}
}

// walkChain shrinks the candidate set alive along hashes, recording in drop[slot] the index of the
// first block a candidate lacks (len(hashes) for those that hold all of them). Each hash is looked
// up XORed with salt: 0 for the GPU, a tier's constant for its tier keys (local.TierKey).
func walkChain(hashes []uint64, salt uint64, words []*bitTable, alive []uint64, drop []int32, live bool) {
	for b := 0; live && b < len(hashes); b++ {
		h := hashes[b] ^ salt
		live = false
		for g, a := range alive {
			if a == 0 {
				continue
			}
			m := words[g].get(h)
			for gone := a &^ m; gone != 0; gone &= gone - 1 {
				drop[g*64+bits.TrailingZeros64(gone)] = int32(b)
			}
			if a &= m; a != 0 {
				live = true
			}
			alive[g] = a
		}
	}
	for g, a := range alive {
		for ; a != 0; a &= a - 1 {
			drop[g*64+bits.TrailingZeros64(a)] = int32(len(hashes))
		}
	}
}
