package kvevents

import (
	"sync"
	"time"

	"github.com/prefixmesh/prefixmesh/local"
)

// CacheMirror is the node's copy of an engine's prefix cache, rebuilt from its KV events. Blocks are
// keyed by the engine's own hash (opaque; never recomputed) per (data-parallel rank, KV-cache
// group); beside each, the mirror keeps the canonical chained hash that routers
// compute from a prompt, derived from the parent's canonical hash and the block's tokens.
//
// A block is visible, i.e. in the summary the node gossips and matched by PeekMatchedTokens,
// exactly when the engine would match it: it is held on the GPU (at least one copy; the same
// hash stored twice is two copies and is removed twice), it has no extra keys beyond its LoRA
// adapter (a block with multimodal ids, a cache salt or prompt embeddings never matches a request
// without them), and its parent is the root or visible. So a
// removed interior block ends every match there, as in the engine, and its still-cached
// children become visible again if it is stored again. A block whose parent was never reported
// (late join, lost message) is kept but not visible until its chain reaches the root.
//
// A model with several KV-cache groups (vLLM's hybrid allocator: full attention beside sliding
// window or Mamba layers; group_idx in the events) gets a hit only as far as every group
// agrees: vLLM's HybridKVCacheCoordinator.find_longest_cache_hit (vllm/v1/core/
// kv_cache_coordinator.py) shortens the full-attention hit until each other group's manager
// (SlidingWindowManager, MambaManager in vllm/v1/core/single_type_kv_cache_manager.py) also
// accepts that length. The mirror credits a block only while every group the rank reported
// holds it, in a chain from the root: then each group's finder accepts that length (a full
// attention prefix, a sliding window's last blocks, Mamba's last block all present), so the
// credit is a lower bound of the engine's hit. Full attention decides the chain; the other
// groups can only shorten it. vLLM's own hit can be longer (a sliding-window group need not hold
// blocks outside its window), which the mirror does not claim.
//
// Lower tiers (CPU, disk, storage, remote, other: see Tier) are copies like the GPU's, counted
// per block and tier, and never make a block visible: a block evicted from the GPU but still
// held on the CPU stays in the mirror, its canonical hash leaves the summary and its CPU tier key
// (local.TierKey) stays there, and PeekMatchedTokensByTier says how far each lower tier
// continues the GPU prefix. vLLM's offloading connector describes an
// offloaded chunk by its constituent GPU blocks (vllm/distributed/kv_transfer/kv_connector/v1/
// offloading/events.py): chunks overlapping an unaligned shared prefix announce the shared
// hashes once per chunk and remove them as often, so every announcement is a copy, reference
// counted like the GPU's. Its legacy placeholders (one hash, no tokens) add a copy to a block the
// mirror knows and nothing else. A tier that has never sent a removal on a rank may be one that
// never does (LMCache's connector forwards only BlockStored: vllm/distributed/kv_transfer/
// kv_connector/v1/lmcache_connector.py), so its copies age out after the unremoved-tier TTL
// (SetUnremovedTTL) rather than being trusted forever; once the tier removes a block on the
// rank, its copies are left to its removals.
//
// CacheMirror is safe for concurrent use: one lock guards it, the summary journal included, so the
// summary is always exactly the set PeekMatchedTokens matches. It satisfies node.Tree (read-only:
// the calls that take holds or insert do nothing, since the engine owns its cache) and
// cluster.Source.
type CacheMirror struct {
	blockSize int

	mu    sync.Mutex // guards everything below
	byKey map[mkey]int32
	nodes []mnode
	free  []int32
	canon map[uint64]uint32 // canonical hash → visible blocks with it (over ranks)
	// pending holds the tokens of known blocks whose canonical hash cannot be computed yet (their
	// chain does not reach the root): rare, so kept beside the arena rather than in every node.
	pending map[int32][]uint32
	journal local.Journal
	stack   []int32
	stats   MirrorStats
	// Hybrid models (several KV-cache groups): a canonical hash is credited for a rank (counted
	// in canon) only while it is visible in every group the rank has reported, gvis counting
	// the groups it is visible in, groups the rank's groups (see CacheMirror).
	gvis   map[rcKey]uint16
	nvis   map[mkey]uint32 // visible nodes per (canonical hash, rank and group)
	groups map[uint32][]uint16
	seqs   map[int]RankSeq // each rank's position in its stream (checkpoints)
	// lower counts, per canonical hash, the nodes with a canon that hold a copy on each lower
	// tier (index TierGPU unused): what PeekMatchedTokensByTier continues the GPU prefix with.
	lower map[uint64][numTiers]uint32
	// Ageing of copies on tiers that may never send removals (see CacheMirror): removes has bit t
	// set for a rank once tier t removed a block there; aging holds one entry per copy stored
	// on a tier without that bit, in store order (so by expiry), from agingHead on.
	removes   map[uint32]uint8
	aging     []agingCopy
	agingHead int
	ttl       time.Duration
	now       func() time.Time
}

// agingCopy is one copy on a tier that has not sent removals: it is dropped at expiry unless the
// tier has removed a block on its rank since.
type agingCopy struct {
	key    mkey
	idx    int32
	tier   Tier
	expiry int64 // unix nanoseconds
}

// DefaultUnremovedTierTTL is how long a copy on a tier that never sent a removal is believed:
// 10 minutes. LMCache's CPU and disk backends evict by LRU under memory pressure and tell nobody;
// on a busy node their working set turns over in minutes, so a copy older than that is more
// likely gone than not, and crediting a block the engine must recompute costs a whole prefill,
// while forgetting one it still holds costs only a missed affinity.
const DefaultUnremovedTierTTL = 10 * time.Minute

// rcKey is a canonical hash within one rank.
type rcKey struct {
	canon uint64
	rank  uint32
}

// MirrorStats are the mirror's levels and counters.
type MirrorStats struct {
	Blocks         int              // mirrored blocks (any tier, placeholders excluded)
	Tiers          [numTiers]int    // copies held per tier
	Visible        int              // blocks matchable from the root (the summary, by hash count)
	Orphans        int              // stored blocks whose chain does not reach the root
	Unknown        uint64           // removals or tier updates of hashes the mirror does not hold
	Underrun       uint64           // removals of a tier the block had no copy on
	Unaligned      uint64           // stored events whose tokens do not line up with their hashes
	WrongBlockSize uint64           // stored events with another block size than the node's
	Cleared        uint64           // AllBlocksCleared events and resets applied
	Cycles         uint64           // stored blocks that named a descendant as parent (dropped as corrupt)
	Provisional    int              // GPU copies restored from a checkpoint, not confirmed since
	Placeholders   uint64           // offload placeholders (no tokens) that added a copy to a known block
	AgedOut        [numTiers]uint64 // copies on tiers that never sent a removal, dropped after the TTL
}

// mkey identifies an engine block: its hash within one (rank, group).
type mkey struct {
	hash uint64
	src  uint32 // rank<<16 | group
}

func srcOf(rank, group int) uint32 { return uint32(rank)<<16 | uint32(group&0xffff) }

const (
	noNode   int32 = -1
	rootNode int32 = -2 // parent is the root (parent_block_hash nil)
)

// Node flags.
const (
	fKnown   uint8 = 1 << iota // a BlockStored with tokens was seen (else a placeholder parent)
	fMatch                     // no extra keys beyond the LoRA, group 0, aligned tokens, right block size
	fCanon                     // canon is valid (the chain to the root is known and matchable)
	fVisible                   // counted in canon and the summary
	fDead                      // can never get a canon: it or an ancestor is not matchable
)

type mnode struct {
	key    mkey
	canon  uint64
	parent int32 // rootNode, noNode (unknown: a placeholder's parent), or an arena index
	first  int32 // first child
	next   int32 // next sibling
	prev   int32 // previous sibling
	copies [numTiers]uint32
	flags  uint8
	// prov counts GPU copies restored from a checkpoint and not seen stored since: the engine
	// may have evicted them while the agent was down. The engine storing the block again
	// confirms one (it is not a new copy); a removal takes one away.
	prov uint8
}

// NewCacheMirror returns an empty mirror for an engine whose KV blocks hold blockSize tokens.
func NewCacheMirror(blockSize int) *CacheMirror {
	m := &CacheMirror{blockSize: blockSize, byKey: make(map[mkey]int32), canon: make(map[uint64]uint32), pending: make(map[int32][]uint32),
		gvis: make(map[rcKey]uint16), nvis: make(map[mkey]uint32), groups: make(map[uint32][]uint16),
		seqs: make(map[int]RankSeq), lower: make(map[uint64][numTiers]uint32), removes: make(map[uint32]uint8),
		ttl: DefaultUnremovedTierTTL, now: time.Now}
	m.journal.Init(local.DefaultJournalCapacity)
	return m
}

// BlockSize is the block size the mirror matches with.
func (m *CacheMirror) BlockSize() int { return m.blockSize }

// Stats returns the mirror's levels and counters.
func (m *CacheMirror) MirrorStats() MirrorStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.stats
	s.Visible = len(m.canon)
	return s
}

// Apply applies one event from data-parallel rank rank. A LoRA name maps to the adapter id
// routers hash with by AdapterID.
func (m *CacheMirror) Apply(rank int, ev *Event) {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch ev.Kind {
	case KindStored:
		m.store(rank, ev)
	case KindRemoved:
		m.remove(rank, ev)
	case KindCleared:
		m.clearLocked(rank)
	}
}

// Clear drops every block of rank (AllBlocksCleared, an engine restart, a resync).
func (m *CacheMirror) Clear(rank int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.clearLocked(rank)
}

func (m *CacheMirror) store(rank int, ev *Event) {
	src := srcOf(rank, ev.Group)
	tier := ev.Tier
	if len(ev.Hashes) == 0 {
		return
	}
	var expiry int64 // when copies stored now age out; 0: they don't (see CacheMirror)
	if tier != TierGPU && m.ttl > 0 && m.removes[uint32(rank)]&(1<<tier) == 0 {
		expiry = m.now().Add(m.ttl).UnixNano()
	}
	if len(ev.Tokens) == 0 {
		// A placeholder (vLLM's offloading connector before self-describing events, and for
		// sliding-window and SSM groups: one hash, no tokens, block size 0): a location update
		// for a block already seen, nothing for one never seen (its place in a chain is unknown).
		for _, h := range ev.Hashes {
			if i, ok := m.byKey[mkey{h, src}]; ok && m.nodes[i].flags&fKnown != 0 {
				m.storeCopy(i, tier)
				m.stats.Placeholders++
				if expiry != 0 {
					m.enqueueAging(i, tier, expiry)
				}
			} else {
				m.stats.Unknown++
			}
		}
		return
	}
	bs := ev.BlockSize
	aligned := bs > 0 && len(ev.Tokens) == len(ev.Hashes)*bs
	match := !ev.Salted && aligned
	m.addGroup(uint32(rank), uint16(ev.Group))
	if !aligned {
		m.stats.Unaligned++
	} else if bs != m.blockSize {
		m.stats.WrongBlockSize++
		match = false
	}
	adapter := local.AdapterIDOf(ev.LoRAName)
	// The first block's parent is looked up (or made a placeholder) only when a new block links
	// to it, so a re-store of known blocks leaves no childless placeholder behind.
	parent, parentKey, lazy := rootNode, mkey{ev.Parent, src}, ev.HasParent
	for i, h := range ev.Hashes {
		var chunk []uint32
		if aligned {
			chunk = ev.Tokens[i*bs : (i+1)*bs]
		}
		bm := match && (len(ev.Extra) == 0 || ev.Extra[i] != extraOther)
		idx := m.get(mkey{h, src})
		if m.nodes[idx].flags&fKnown == 0 {
			if lazy {
				parent, lazy = m.get(parentKey), false
			}
			n := &m.nodes[idx]
			n.flags |= fKnown
			if bm {
				n.flags |= fMatch
			}
			m.stats.Blocks++
			if m.cycles(idx, parent) { // a block cannot descend from itself: corrupt input
				m.stats.Cycles++
				m.markDead(idx)
				if parent >= 0 && m.nodes[parent].flags&fKnown == 0 && m.nodes[parent].first == noNode {
					m.maybeFree(parent)
				}
			} else {
				m.link(idx, parent)
				m.resolve(idx, chunk, adapter)
			}
		}
		lazy = false
		m.storeCopy(idx, tier)
		if expiry != 0 {
			m.enqueueAging(idx, tier, expiry)
		}
		parent = idx
	}
}

// get returns the node for k, creating a placeholder (unknown, no copies) if there is none.
func (m *CacheMirror) get(k mkey) int32 {
	if i, ok := m.byKey[k]; ok {
		return i
	}
	var i int32
	if n := len(m.free); n > 0 {
		i = m.free[n-1]
		m.free = m.free[:n-1]
	} else {
		m.nodes = append(m.nodes, mnode{})
		i = int32(len(m.nodes) - 1)
	}
	m.nodes[i] = mnode{key: k, parent: noNode, first: noNode, next: noNode, prev: noNode}
	m.byKey[k] = i
	return i
}

// cycles reports whether making p the parent of c would close a loop: p is c or below it. Only a
// placeholder that already has children can be an ancestor of p, so fresh blocks cost nothing.
func (m *CacheMirror) cycles(c, p int32) bool {
	if c == p {
		return true
	}
	if m.nodes[c].first == noNode {
		return false
	}
	for x := p; x >= 0; x = m.nodes[x].parent {
		if x == c {
			return true
		}
	}
	return false
}

// link makes p (rootNode or an arena index) the parent of c, which has none yet.
func (m *CacheMirror) link(c, p int32) {
	n := &m.nodes[c]
	n.parent = p
	if p < 0 {
		return
	}
	pn := &m.nodes[p]
	n.next = pn.first
	if pn.first != noNode {
		m.nodes[pn.first].prev = c
	}
	pn.first = c
}

func (m *CacheMirror) unlink(c int32) {
	n := &m.nodes[c]
	if n.parent >= 0 {
		if n.prev != noNode {
			m.nodes[n.prev].next = n.next
		} else {
			m.nodes[n.parent].first = n.next
		}
		if n.next != noNode {
			m.nodes[n.next].prev = n.prev
		}
	}
	n.parent, n.next, n.prev = noNode, noNode, noNode
}

// resolve settles a node that just became known: its canonical hash when its chain is known,
// else it keeps its tokens (or, when the chain can never match, is marked dead with its subtree).
func (m *CacheMirror) resolve(c int32, chunk []uint32, adapter uint64) {
	n := &m.nodes[c]
	p := n.parent
	switch {
	case n.flags&fMatch == 0 || (p >= 0 && m.nodes[p].flags&fDead != 0):
		m.markDead(c)
	case p == rootNode:
		n.canon = local.ChainHash(local.AdapterSeed(adapter), chunk)
		n.flags |= fCanon
		m.lowerAll(c, 1)
		m.cascadeCanon(c)
	case p >= 0 && m.nodes[p].flags&fCanon != 0:
		n.canon = local.ChainHash(m.nodes[p].canon, chunk)
		n.flags |= fCanon
		m.lowerAll(c, 1)
		m.cascadeCanon(c)
	default: // the parent's chain is not known yet: keep the tokens for later
		m.pending[c] = append([]uint32(nil), chunk...)
		m.stats.Orphans++
	}
}

// cascadeCanon computes the canonical hash of every known descendant of c waiting for one.
func (m *CacheMirror) cascadeCanon(c int32) {
	m.stack = append(m.stack[:0], c)
	for len(m.stack) > 0 {
		x := m.stack[len(m.stack)-1]
		m.stack = m.stack[:len(m.stack)-1]
		for k := m.nodes[x].first; k != noNode; k = m.nodes[k].next {
			kn := &m.nodes[k]
			if kn.flags&(fKnown|fCanon|fDead) != fKnown {
				continue
			}
			if kn.flags&fMatch == 0 {
				m.markDeadFrom(k)
				continue
			}
			kn.canon = local.ChainHash(m.nodes[x].canon, m.pending[k])
			delete(m.pending, k)
			kn.flags |= fCanon
			m.lowerAll(k, 1)
			m.stats.Orphans--
			m.stack = append(m.stack, k)
		}
	}
	// Visibility follows: the nodes that just got a canon may now be reachable.
	m.refresh(c)
}

// markDead marks c and its known descendants as never matchable and drops kept tokens.
func (m *CacheMirror) markDead(c int32) {
	m.markDeadFrom(c)
}

func (m *CacheMirror) markDeadFrom(c int32) {
	var st []int32
	st = append(st, c)
	for len(st) > 0 {
		x := st[len(st)-1]
		st = st[:len(st)-1]
		n := &m.nodes[x]
		if n.flags&fDead != 0 {
			continue
		}
		n.flags |= fDead
		if _, ok := m.pending[x]; ok {
			delete(m.pending, x)
			m.stats.Orphans--
		}
		for k := n.first; k != noNode; k = m.nodes[k].next {
			if m.nodes[k].flags&fKnown != 0 {
				st = append(st, k)
			}
		}
	}
}

// shouldShow: c can be visible given its parent's visibility.
func (m *CacheMirror) shouldShow(c int32) bool {
	n := &m.nodes[c]
	if n.flags&fCanon == 0 || n.copies[TierGPU] == 0 {
		return false
	}
	return n.parent == rootNode || (n.parent >= 0 && m.nodes[n.parent].flags&fVisible != 0)
}

// refresh brings c's visibility (and its subtree's) in line with the rule.
func (m *CacheMirror) refresh(c int32) {
	vis := m.nodes[c].flags&fVisible != 0
	switch want := m.shouldShow(c); {
	case want && !vis:
		m.show(c)
	case !want && vis:
		m.hide(c)
	}
}

func (m *CacheMirror) show(c int32) {
	m.stack = append(m.stack[:0], c)
	for len(m.stack) > 0 {
		x := m.stack[len(m.stack)-1]
		m.stack = m.stack[:len(m.stack)-1]
		n := &m.nodes[x]
		n.flags |= fVisible
		m.groupShow(n.key.src, n.canon)
		for k := n.first; k != noNode; k = m.nodes[k].next {
			if m.nodes[k].flags&fVisible == 0 && m.shouldShow(k) {
				m.stack = append(m.stack, k)
			}
		}
	}
}

func (m *CacheMirror) hide(c int32) {
	m.stack = append(m.stack[:0], c)
	for len(m.stack) > 0 {
		x := m.stack[len(m.stack)-1]
		m.stack = m.stack[:len(m.stack)-1]
		n := &m.nodes[x]
		n.flags &^= fVisible
		m.groupHide(n.key.src, n.canon)
		for k := n.first; k != noNode; k = m.nodes[k].next {
			if m.nodes[k].flags&fVisible != 0 {
				m.stack = append(m.stack, k)
			}
		}
	}
}

// credit and uncredit count a canonical hash in the summary (over ranks).
func (m *CacheMirror) credit(h uint64) {
	if m.canon[h]++; m.canon[h] == 1 {
		m.journal.Emit(h, true)
	}
}

func (m *CacheMirror) uncredit(h uint64) {
	if v := m.canon[h]; v <= 1 {
		delete(m.canon, h)
		m.journal.Emit(h, false)
	} else {
		m.canon[h] = v - 1
	}
}

// groupShow and groupHide track a node of src becoming visible or hidden with canonical hash
// h. With one group (every non-hybrid model) they count it in the summary directly; with
// several, nvis counts the visible nodes per group and gvis the groups holding h, and h is
// credited once for the rank while every group holds it.
func (m *CacheMirror) groupShow(src uint32, h uint64) {
	rank := src >> 16
	n := len(m.groups[rank])
	if n <= 1 {
		m.credit(h)
		return
	}
	gk := mkey{h, src}
	if m.nvis[gk]++; m.nvis[gk] > 1 {
		return
	}
	k := rcKey{h, rank}
	v := m.gvis[k] + 1
	m.gvis[k] = v
	if int(v) == n {
		m.credit(h)
	}
}

func (m *CacheMirror) groupHide(src uint32, h uint64) {
	rank := src >> 16
	n := len(m.groups[rank])
	if n <= 1 {
		m.uncredit(h)
		return
	}
	gk := mkey{h, src}
	if c := m.nvis[gk]; c > 1 {
		m.nvis[gk] = c - 1
		return
	}
	delete(m.nvis, gk)
	k := rcKey{h, rank}
	v := m.gvis[k]
	if int(v) == n {
		m.uncredit(h)
	}
	if v <= 1 {
		delete(m.gvis, k)
	} else {
		m.gvis[k] = v - 1
	}
}

// addGroup records that rank reports KV-cache group g. A second group turns on the hybrid rule:
// what was credited from the first alone is counted per group and uncredited until the new
// group holds it too.
func (m *CacheMirror) addGroup(rank uint32, g uint16) {
	gs := m.groups[rank]
	for _, x := range gs {
		if x == g {
			return
		}
	}
	was := len(gs)
	m.groups[rank] = append(gs, g)
	if was == 0 {
		return
	}
	if was == 1 { // the rank's visible nodes were credited directly: count them per group now
		for i := range m.nodes {
			n := &m.nodes[i]
			if n.flags&fVisible == 0 || n.key.src>>16 != rank {
				continue
			}
			gk := mkey{n.canon, n.key.src}
			if m.nvis[gk]++; m.nvis[gk] == 1 {
				m.gvis[rcKey{n.canon, rank}]++
			}
			m.uncredit(n.canon) // one credit per visible node in single-group counting
		}
		return // no hash is in both groups yet
	}
	for k, v := range m.gvis {
		if k.rank == rank && int(v) == was {
			m.uncredit(k.canon)
		}
	}
}

// storeCopy counts a stored copy, unless it confirms one restored from a checkpoint.
func (m *CacheMirror) storeCopy(c int32, t Tier) {
	if n := &m.nodes[c]; t == TierGPU && n.prov > 0 {
		n.prov--
		m.stats.Provisional--
		return
	}
	m.addCopy(c, t)
}

func (m *CacheMirror) addCopy(c int32, t Tier) {
	n := &m.nodes[c]
	n.copies[t]++
	m.stats.Tiers[t]++
	switch {
	case t == TierGPU && n.copies[t] == 1:
		m.refresh(c)
	case t != TierGPU && n.copies[t] == 1 && n.flags&fCanon != 0:
		m.lowerAdd(n.canon, t, 1)
	}
}

// dropCopy takes one copy on tier t (which c holds) away and frees c if it was the last.
func (m *CacheMirror) dropCopy(c int32, t Tier) {
	n := &m.nodes[c]
	n.copies[t]--
	m.stats.Tiers[t]--
	if t == TierGPU && uint32(n.prov) > n.copies[TierGPU] {
		n.prov--
		m.stats.Provisional--
	}
	switch {
	case t == TierGPU && n.copies[TierGPU] == 0:
		m.refresh(c)
	case t != TierGPU && n.copies[t] == 0 && n.flags&fCanon != 0:
		m.lowerAdd(n.canon, t, -1)
	}
	m.maybeFree(c)
}

// lowerAdd counts a node with canonical hash h gaining (d = 1) or losing (d = -1) its copies on
// lower tier t.
func (m *CacheMirror) lowerAdd(h uint64, t Tier, d int) {
	v := m.lower[h]
	v[t] = uint32(int(v[t]) + d)
	if t < TierOther && (d > 0 && v[t] == 1 || d < 0 && v[t] == 0) {
		// The first copy on t appeared, or the last left: the summary's tier key follows.
		m.journal.Emit(local.TierKey(h, local.Tier(t)), d > 0)
	}
	if v == ([numTiers]uint32{}) {
		delete(m.lower, h)
		return
	}
	m.lower[h] = v
}

// lowerAll counts (d = 1) or uncounts (d = -1) every lower tier c holds copies on: c just got its
// canonical hash, or is being dropped with it.
func (m *CacheMirror) lowerAll(c int32, d int) {
	n := &m.nodes[c]
	for t := TierGPU + 1; t < numTiers; t++ {
		if n.copies[t] > 0 {
			m.lowerAdd(n.canon, t, d)
		}
	}
}

func (m *CacheMirror) remove(rank int, ev *Event) {
	src := srcOf(rank, ev.Group)
	// This tier removes blocks on this rank: its copies are left to its removals from now on.
	m.removes[uint32(rank)] |= 1 << ev.Tier
	for _, h := range ev.Hashes {
		c, ok := m.byKey[mkey{h, src}]
		if !ok || m.nodes[c].flags&fKnown == 0 {
			m.stats.Unknown++
			continue
		}
		if m.nodes[c].copies[ev.Tier] == 0 {
			m.stats.Underrun++
			continue
		}
		m.dropCopy(c, ev.Tier)
	}
}

// SetUnremovedTTL sets how long a copy on a tier that has not sent a removal is believed (see
// CacheMirror; DefaultUnremovedTierTTL unless set); 0 believes such copies until removed.
func (m *CacheMirror) SetUnremovedTTL(d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ttl = max(d, 0)
}

// SetClock replaces the clock ageing reads (time.Now): tests step it.
func (m *CacheMirror) SetClock(now func() time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.now = now
}

// Expire drops the copies whose TTL has run out (see CacheMirror) and returns how many. The follower
// calls it after each batch and on its idle tick; PeekMatchedTokensByTier checks too, so a quiet
// engine's stale copies are never answered.
func (m *CacheMirror) Expire() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.expireLocked()
}

func (m *CacheMirror) expireLocked() int {
	if m.agingHead == len(m.aging) {
		return 0
	}
	now := m.now().UnixNano()
	dropped := 0
	for m.agingHead < len(m.aging) && m.aging[m.agingHead].expiry <= now {
		e := m.aging[m.agingHead]
		m.agingHead++
		if m.removes[e.key.src>>16]&(1<<e.tier) != 0 {
			continue // the tier removes its blocks itself
		}
		if i, ok := m.byKey[e.key]; !ok || i != e.idx || m.nodes[i].copies[e.tier] == 0 {
			continue
		}
		m.dropCopy(e.idx, e.tier)
		m.stats.AgedOut[e.tier]++
		dropped++
	}
	if m.agingHead == len(m.aging) {
		m.aging, m.agingHead = m.aging[:0], 0
	} else if m.agingHead > len(m.aging)/2 { // reuse the consumed front
		n := copy(m.aging, m.aging[m.agingHead:])
		m.aging, m.agingHead = m.aging[:n], 0
	}
	return dropped
}

func (m *CacheMirror) enqueueAging(c int32, t Tier, expiry int64) {
	m.aging = append(m.aging, agingCopy{key: m.nodes[c].key, idx: c, tier: t, expiry: expiry})
}

// maybeFree frees c, and then its ancestors, while they hold no copy and have no children.
func (m *CacheMirror) maybeFree(c int32) {
	for c >= 0 {
		n := &m.nodes[c]
		if n.first != noNode || n.copies != ([numTiers]uint32{}) {
			return
		}
		p := n.parent
		if n.flags&fVisible != 0 { // unreachable: no GPU copy means not visible
			m.hide(c)
		}
		m.unlink(c)
		if n.flags&fKnown != 0 {
			m.stats.Blocks--
			if _, ok := m.pending[c]; ok {
				delete(m.pending, c)
				m.stats.Orphans--
			}
		}
		delete(m.byKey, n.key)
		*n = freeNode
		m.free = append(m.free, c)
		c = p
	}
}

// clearLocked drops every node of rank: visible ones leave the summary first (Removed events),
// then the rank's slots return to the free list. Nodes of other ranks never link into this rank's
// (parents are looked up within one rank and group), so their links stay valid.
func (m *CacheMirror) clearLocked(rank int) {
	m.stats.Cleared++
	mine := func(i int) bool {
		n := &m.nodes[i]
		j, ok := m.byKey[n.key]
		return ok && j == int32(i) && int(n.key.src>>16) == rank
	}
	for i := range m.nodes {
		if m.nodes[i].flags&fVisible != 0 && mine(i) {
			m.hide(int32(i))
		}
	}
	// The groups are learnt again from the next events (a restarted engine may serve another
	// model); every hash of the rank was hidden above, so no count is left behind.
	delete(m.groups, uint32(rank))
	for i := range m.nodes {
		if !mine(i) {
			continue
		}
		n := &m.nodes[i]
		if n.flags&fCanon != 0 {
			m.lowerAll(int32(i), -1)
		}
		for t := range n.copies {
			m.stats.Tiers[t] -= int(n.copies[t])
		}
		m.stats.Provisional -= int(n.prov)
		if n.flags&fKnown != 0 {
			m.stats.Blocks--
			if _, ok := m.pending[int32(i)]; ok {
				delete(m.pending, int32(i))
				m.stats.Orphans--
			}
		}
		delete(m.byKey, n.key)
		*n = freeNode
		m.free = append(m.free, int32(i))
	}
	// The rank's ageing copies are gone: drop their entries, so that one cannot take away a
	// copy of the same hash stored after the clear.
	kept := m.aging[:m.agingHead]
	for _, e := range m.aging[m.agingHead:] {
		if int(e.key.src>>16) != rank {
			kept = append(kept, e)
		}
	}
	m.aging = kept
}

var freeNode = mnode{parent: noNode, first: noNode, next: noNode, prev: noNode}
