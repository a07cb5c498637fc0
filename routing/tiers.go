package routing

import (
	"cmp"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"strings"

	"github.com/prefixmesh/prefixmesh/local"
)

// KV beyond the GPU (POLICIES.md, "Tiers"). A node whose engine offloads KV to CPU memory, disk
// or a shared store summarises each offloaded block under its tier key (local.TierKey), so the
// index holds tiers as it holds GPU blocks, one bit per node in one 16-byte slot per key. An
// engine serves a prompt from its GPU prefix first and then loads what its connector holds from
// the block after it on (vLLM's scheduler asks the KV connector for the tokens past the local
// prefix hit), so lower tiers only continue the GPU prefix and a gap ends the match: a block on
// no tier stops the node's run even if later blocks are held.

// TierTokens counts a request's matched tokens on one node per tier: [local.TierGPU] is the GPU
// prefix, each other entry the tokens of the run that continues it which are held on that tier
// (a block held on several counts on the fastest, the lowest index).
type TierTokens [local.NumTiers]int

// Lower is the number of tokens the lower tiers add to the GPU prefix.
func (t *TierTokens) Lower() int {
	n := 0
	for _, v := range t[local.TierGPU+1:] {
		n += v
	}
	return n
}

// Total is the whole matched prefix: what an engine reports as cached once it has loaded the
// lower tiers' part (vLLM counts the connector's tokens in num_cached_tokens).
func (t *TierTokens) Total() int { return t[local.TierGPU] + t.Lower() }

// tierScratch is ContinueLower's pooled working memory.
type tierScratch struct {
	estimateScratch
	starts []slotStart  // requested nodes with a run to continue, by start block
	counts []TierTokens // by slot: blocks per lower tier (tokens once scaled)
}

// ContinueLower writes to lower[i] the tokens (blocks × blockSize) of nodes[i]'s lower-tier run
// that continues its GPU prefix of gpuBlocks[i] blocks along hashes, per tier;
// lower[i][local.TierGPU] is left 0.
// A node the index does not know, or whose GPU prefix covers every hash, gets zeros. It panics
// if gpuBlocks or lower is shorter than nodes.
//
// One walk from the earliest start: a node joins the candidate set at its own start block and
// leaves at its first block held on no lower tier; each block costs one lookup per lower tier per
// 64 nodes still in a run, and the walk stops when no run is left. It allocates nothing in steady
// state.
func (x *Index) ContinueLower(hashes []uint64, nodes []string, gpuBlocks []int, blockSize int, lower []TierTokens) {
	lower = lower[:len(nodes)]
	clear(lower)
	x.mu.RLock()
	defer x.mu.RUnlock()
	sc, _ := x.tierScratch.Get().(*tierScratch)
	if sc == nil {
		sc = new(tierScratch)
	}
	defer x.tierScratch.Put(sc)
	sc.reset(len(x.words), len(x.nodes), len(nodes))
	sc.counts = grow(sc.counts, len(x.nodes))
	sc.starts = sc.starts[:0]
	for i, s := range sc.slotsOf(&x.slots, nodes) {
		sc.parked[i] = s
		if s >= 0 && gpuBlocks[i] < len(hashes) {
			sc.counts[s] = TierTokens{}
			sc.starts = append(sc.starts, slotStart{start: int32(max(gpuBlocks[i], 0)), slot: s})
		}
	}
	if len(sc.starts) == 0 {
		return
	}
	slices.SortFunc(sc.starts, func(a, b slotStart) int { return cmp.Compare(a.start, b.start) })
	alive, next := sc.alive, 0
	for b := int(sc.starts[0].start); b < len(hashes); b++ {
		for ; next < len(sc.starts) && int(sc.starts[next].start) == b; next++ {
			s := sc.starts[next].slot
			alive[s>>6] |= 1 << (uint(s) & 63)
		}
		live := false
		for g, a := range alive {
			if a == 0 {
				continue
			}
			left := a // the group's runs not yet found on a tier at this block
			for t := local.TierGPU + 1; t < local.NumTiers && left != 0; t++ {
				m := x.words[g].get(local.TierKey(hashes[b], t)) & left
				for on := m; on != 0; on &= on - 1 {
					sc.counts[g*64+bits.TrailingZeros64(on)][t]++
				}
				left &^= m
			}
			if a &^= left; a != 0 {
				live = true
			}
			alive[g] = a
		}
		if !live {
			if next == len(sc.starts) {
				break
			}
			b = int(sc.starts[next].start) - 1 // jump to the next run's start
		}
	}
	for i, s := range sc.parked {
		if s >= 0 && gpuBlocks[i] < len(hashes) {
			for t, n := range sc.counts[s] {
				lower[i][t] = n * blockSize
			}
		}
	}
}

// tierCost is what n's lower-tier match is worth to a request: the tokens credited (taken off
// the uncached work) and the load time of all of them, in tokens of n's prefill time. A tier whose
// load cost (learned, else configured) is below 1 is credited and costs that fraction per
// token; one at 1 or more is not credited and costs its excess over recomputing.
func tierCost(n *NodeInfo, tiers *TierTokens, cfg *PolicyConfig) (credited int, load float64) {
	if tiers == nil {
		return 0, 0
	}
	for t := local.TierGPU + 1; t < local.NumTiers; t++ {
		tok := tiers[t]
		if tok <= 0 {
			continue
		}
		r := tierLoadCost(n, t, cfg)
		if r < 1 {
			credited += tok
			load += r * float64(tok)
		} else {
			load += (r - 1) * float64(tok)
		}
	}
	return credited, load
}

// tierLoadCost is n's load cost on tier t: learned, else configured.
func tierLoadCost(n *NodeInfo, t local.Tier, cfg *PolicyConfig) float64 {
	if r := n.TierLoad[t]; r > 0 {
		return r
	}
	return cfg.TierLoadCost[t]
}

func validTierCosts(c [local.NumTiers]float64) bool {
	for _, v := range c {
		if !(v >= 0) || math.IsInf(v, 1) {
			return false
		}
	}
	return true
}

// Learning a node's tier load cost. After a request whose match on the chosen node continued on
// exactly one lower tier reaches its first token, the time beyond what the node's fit predicts
// for its prefill and queue is the load's; divided by the tokens loaded and the node's prefill
// time per token, it is one sample of the tier's load cost. A node's cost per tier is the
// forgetting mean of its samples (about tierMemory recent ones) shrunk toward the configured
// prior with tierPrior samples' weight, clamped to [tierMinCost, tierMaxCost]. Requests whose
// match spans several lower tiers teach nothing: the split of their load is unknown.
const (
	tierMemory  = 64
	tierPrior   = 8.0
	tierMinCost = 1.0 / 1000
	tierMaxCost = 4.0
)

// tierLearner is one node's learned load costs, per tier.
type tierLearner struct {
	sum, n [local.NumTiers]float64
}

// cost is the learned cost on tier t shrunk toward prior; 0 before any sample.
func (l *tierLearner) cost(t local.Tier, prior float64) float64 {
	if l == nil || l.n[t] == 0 {
		return 0
	}
	return clamp((l.sum[t]+tierPrior*prior)/(l.n[t]+tierPrior), tierMinCost, tierMaxCost)
}

// tierLoadLocked is node's learned tier costs (0 where none). Callers hold d.mu.
func (d *Decider) tierLoadLocked(node string) (out [local.NumTiers]float64) {
	l := d.tierCosts[node]
	if l == nil {
		return out
	}
	for t := local.TierGPU + 1; t < local.NumTiers; t++ {
		out[t] = l.cost(t, d.pcfg.TierLoadCost[t])
	}
	return out
}

// noteTiers records on t what its node's lower tiers were predicted to save and cost, for
// learnTierLocked and the fits.
func (d *Decider) noteTiers(t *Ticket, n *NodeInfo, tiers *TierTokens) {
	t.tiers = *tiers
	t.tiers[local.TierGPU] = 0
	if d.pcfg.IgnoreTiers || t.tiers == (TierTokens{}) {
		t.credited, t.loadSec = 0, 0
		return
	}
	credited, load := tierCost(n, &t.tiers, &d.pcfg)
	t.secPer = n.TTFT.PrefillScale() / nominalRate(n, &d.pcfg)
	t.credited, t.loadSec = credited, load*t.secPer
}

// learnTierLocked teaches t's node a sample of its tier's load cost from a first token y seconds
// after the decision. Callers hold d.mu.
func (d *Decider) learnTierLocked(t *Ticket, y float64) {
	tier, tok := local.TierGPU, 0
	for i := local.TierGPU + 1; i < local.NumTiers; i++ {
		if t.tiers[i] > 0 {
			if tok > 0 {
				return // several tiers: the split of the load is unknown
			}
			tier, tok = i, t.tiers[i]
		}
	}
	if tok == 0 || !(t.secPer > 0) || !plausibleTTFT(t.work, t.seqs, y) {
		return
	}
	fit := d.fleet.fit
	if l := d.learned[t.node]; l != nil && l.distinctFrom(fit) {
		fit = l.fit
	}
	base := fit.Overhead + fit.PrefillScale()*t.work + fit.PerSeq*t.seqs
	sample := clamp((y-base)/(float64(tok)*t.secPer), tierMinCost, tierMaxCost)
	l := d.tierCosts[t.node]
	if l == nil {
		l = new(tierLearner)
		d.tierCosts[t.node] = l
	}
	keep := 1 - 1.0/tierMemory
	l.sum[tier] = keep*l.sum[tier] + sample
	l.n[tier] = keep*l.n[tier] + 1
}

// ParseTierCosts reads a --tier-load-cost value, "cpu=0.067,disk=0.85" (tier names as
// local.Tier.String; the tiers not named keep their value in costs), into costs.
func ParseTierCosts(s string, costs *[local.NumTiers]float64) error {
	if strings.TrimSpace(s) == "" {
		return nil
	}
	for _, part := range strings.Split(s, ",") {
		name, val, ok := strings.Cut(strings.TrimSpace(part), "=")
		t := local.TierGPU
		for i := local.TierGPU + 1; i < local.NumTiers; i++ {
			if i.String() == name {
				t = i
			}
		}
		if !ok || t == local.TierGPU {
			return fmt.Errorf("tier load cost %q: want tier=cost with tier cpu, disk, storage or remote: %w", part, ErrInvalid)
		}
		v, err := strconv.ParseFloat(val, 64)
		if err != nil || !(v >= 0) || math.IsInf(v, 1) {
			return fmt.Errorf("tier load cost %q: the cost must be a number >= 0 (a fraction of prefilling the token): %w", part, ErrInvalid)
		}
		costs[t] = v
	}
	return nil
}

// FormatTierCosts writes costs as ParseTierCosts reads them.
func FormatTierCosts(costs [local.NumTiers]float64) string {
	var parts []string
	for t := local.TierGPU + 1; t < local.NumTiers; t++ {
		parts = append(parts, t.String()+"="+strconv.FormatFloat(costs[t], 'g', 4, 64))
	}
	return strings.Join(parts, ",")
}
