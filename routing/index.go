package routing

import (
	"fmt"
	"sort"
	"sync"
)

// IndexConfig bounds the summary index.
type IndexConfig struct {
	// MaxPairs bounds the number of (block hash, node) pairs the index holds, and with it the
	// index's memory: at most MaxPairs distinct hashes, each one 16-byte table slot at a load
	// factor between 7/9 and 7/8 (bitTable grows by an eighth), so ≤ 21 bytes per pair with no
	// sharing at all and 14.1 measured at 64 nodes × 100k blocks with realistic sharing
	// (BenchmarkIndexBytesPerPair; 16.4 per (key, node) with a CPU tier beside the GPU,
	// BenchmarkIndexBytesPerPairTiers). A block on a lower tier is one more key (local.TierKey). When the
	// index is full, further adds are refused and counted per node: that node's estimate then
	// under-reports (a shorter chain), which only costs a missed routing opportunity, never a
	// wrong "hit".
	MaxPairs int
	// MaxBytes bounds the heap the index's hash tables take (IndexStats.ApproxBytes), 0 for no
	// bound beyond MaxPairs. When an add would grow a table past it, the add is refused and
	// counted exactly as when MaxPairs is reached: the node's estimate then stops at the first
	// block the index could not hold — a shorter match, never a block the node does not hold —
	// until a snapshot or removals make room. Tables only grow (in powers of two), so the bound
	// is reached in steps and the index stays at or under it.
	MaxBytes int64
}

// DefaultMaxPairs is 64 nodes × 128Ki blocks: a node with 80 GB of KV memory at a 16-token block
// and ~40 KB per block (a 70B-class model with GQA, fp16, tensor-parallel shards summed) holds
// about 128k blocks, and 64 nodes is a large fleet for one model. In the worst case (no sharing
// between nodes, ≤ 21 bytes per pair) the index then stays under 170 MiB, ~115 MiB typically.
const DefaultMaxPairs = 64 << 17

// DefaultIndexConfig returns the configuration used when none is given.
func DefaultIndexConfig() IndexConfig { return IndexConfig{MaxPairs: DefaultMaxPairs} }

// Validate reports whether the configuration is usable.
func (c IndexConfig) Validate() error {
	if c.MaxPairs <= 0 {
		return fmt.Errorf("index config: MaxPairs %d must be positive: %w", c.MaxPairs, ErrInvalid)
	}
	if c.MaxBytes < 0 {
		return fmt.Errorf("index config: MaxBytes %d must not be negative: %w", c.MaxBytes, ErrInvalid)
	}
	return nil
}

// Change is one summary event of a node: Hash became visible (Added) or stopped being visible.
type Change struct {
	Hash  uint64
	Added bool
}

// IndexStats is a point-in-time view of the index's size and counters.
type IndexStats struct {
	Nodes          int    // nodes with a snapshot
	DistinctHashes int    // map entries: the distinct hashes with ≤ 64 nodes, an upper bound beyond
	Pairs          int    // (hash, node) pairs
	MaxPairs       int    // the configured bound
	RefusedAdds    uint64 // adds refused because the index was full, since creation
	ApproxBytes    int64  // heap held by the hash tables (bitTable slots) and node entries
}

// NodeIndexStats is the per-node part of IndexStats.
type NodeIndexStats struct {
	Epoch, Seq  uint64
	Blocks      int    // hashes the index holds for the node
	RefusedAdds uint64 // adds refused for this node since its last snapshot
}

// nodeEntry is what the index knows about one node, by slot.
type nodeEntry struct {
	id      string
	epoch   uint64
	seq     uint64
	blocks  int
	refused uint64
}

// Index maps canonical block hashes to the nodes whose summaries contain them. Nodes are numbered
// by slot and a set of nodes is a bitset: words[g].get(h) has bit s%64 set when the node in slot
// g*64+s%64 holds h. With up to 64 nodes that is one 16-byte table slot per distinct hash,
// however many nodes share it (bitTable). It is safe for concurrent use: many Estimates run in
// parallel, writers (ApplyDelta, ReplaceNode, RemoveNode) take the lock exclusively.
type Index struct {
	maxPairs int
	maxBytes int64

	mu      sync.RWMutex // guards everything below
	slots   slotTable
	nodes   []nodeEntry // by slot
	words   []*bitTable // by 64-slot group: hash → bitmask of slots in the group
	pairs   int
	bytes   int64 // sum of the tables' bytes()
	refused uint64

	scratch     sync.Pool // *estimateScratch, see estimate.go
	tierScratch sync.Pool // *tierScratch, see tiers.go

	hookMu   sync.Mutex
	onRemove []func(node string) // OnRemove
}

// OnRemove registers f to be called, outside the index's lock, after a node is removed
// (RemoveNode) or its summary replaced by one of another epoch (a restart): whatever was kept
// about the node beside the index — a decider's overlay slot — is stale then (Decider does).
func (x *Index) OnRemove(f func(node string)) {
	x.hookMu.Lock()
	defer x.hookMu.Unlock()
	x.onRemove = append(x.onRemove, f)
}

func (x *Index) removed(node string) {
	x.hookMu.Lock()
	hooks := x.onRemove
	x.hookMu.Unlock()
	for _, f := range hooks {
		f(node)
	}
}

// Has reports whether the index holds a summary of node (it is a member the mirror has synced).
func (x *Index) Has(node string) bool {
	x.mu.RLock()
	defer x.mu.RUnlock()
	_, ok := x.slots.lookup(node)
	return ok
}

// NewIndex returns an empty index. A non-positive MaxPairs is replaced by DefaultMaxPairs.
func NewIndex(cfg IndexConfig) *Index {
	if cfg.MaxPairs <= 0 {
		cfg.MaxPairs = DefaultMaxPairs
	}
	return &Index{maxPairs: cfg.MaxPairs, maxBytes: max(cfg.MaxBytes, 0), slots: newSlotTable()}
}

// ApplyDelta applies a node's summary changes (fromSeq, toSeq], in order. It returns
// ErrUnknownNode when the node has no snapshot, ErrEpoch when epoch differs from the node's known
// epoch, and ErrGap when fromSeq is after the known sequence number; in each case nothing changes
// and the caller must ReplaceNode with a full summary. A delta with toSeq <= the known sequence is
// a harmless duplicate: nil, nothing changes.
//
// A delta that overlaps what is known (fromSeq < known seq < toSeq) is applied whole. That is
// exact: the summary is a set and each event sets or clears one member, so after replaying a
// suffix of the history that contains every event since the known sequence, each hash has the
// value of its last event — the same as applying only the new part. Events are applied in order,
// so an add and a remove of the same hash in one delta end as the later one says.
func (x *Index) ApplyDelta(node string, epoch, fromSeq, toSeq uint64, events []Change) error {
	if toSeq < fromSeq {
		return fmt.Errorf("apply delta %q (%d, %d]: %w", node, fromSeq, toSeq, ErrInvalid)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	slot, ok := x.slots.lookup(node)
	if !ok {
		return fmt.Errorf("apply delta %q: %w", node, ErrUnknownNode)
	}
	n := &x.nodes[slot]
	if n.epoch != epoch {
		return fmt.Errorf("apply delta %q: epoch %d, known %d: %w", node, epoch, n.epoch, ErrEpoch)
	}
	if toSeq <= n.seq {
		return nil
	}
	if fromSeq > n.seq {
		return fmt.Errorf("apply delta %q: from %d, known %d: %w", node, fromSeq, n.seq, ErrGap)
	}
	for _, e := range events {
		if e.Added {
			x.add(slot, e.Hash)
		} else {
			x.remove(slot, e.Hash)
		}
	}
	n.seq = toSeq
	return nil
}

// ReplaceNode installs a full snapshot of node's summary at (epoch, seq), dropping everything
// known about the node first.
func (x *Index) ReplaceNode(node string, epoch, seq uint64, hashes []uint64) {
	x.mu.Lock()
	slot, created := x.slots.acquire(node)
	restarted := false
	if created {
		for int(slot) >= len(x.nodes) {
			x.nodes = append(x.nodes, nodeEntry{})
		}
		for len(x.words) < x.slots.words() {
			x.words = append(x.words, &bitTable{})
		}
	} else {
		restarted = x.nodes[slot].epoch != epoch
		x.clearSlot(slot)
	}
	x.nodes[slot] = nodeEntry{id: node, epoch: epoch, seq: seq}
	for _, h := range hashes {
		x.add(slot, h)
	}
	x.mu.Unlock()
	if restarted {
		x.removed(node)
	}
}

// RemoveNode forgets node entirely (it left the cluster).
func (x *Index) RemoveNode(node string) {
	x.mu.Lock()
	slot, ok := x.slots.lookup(node)
	if !ok {
		x.mu.Unlock()
		return
	}
	x.clearSlot(slot)
	x.nodes[slot] = nodeEntry{}
	x.slots.release(node)
	x.nodes = x.nodes[:len(x.slots.ids)]
	x.words = x.words[:x.slots.words()]
	x.mu.Unlock()
	x.removed(node)
}

// NodeState returns the epoch and sequence number the index holds for node and how many hashes.
func (x *Index) NodeState(node string) (epoch, seq uint64, blocks int, ok bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	slot, ok := x.slots.lookup(node)
	if !ok {
		return 0, 0, 0, false
	}
	n := &x.nodes[slot]
	return n.epoch, n.seq, n.blocks, true
}

// NodeStats returns NodeState plus the node's refused-add counter.
func (x *Index) NodeStats(node string) (NodeIndexStats, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	slot, ok := x.slots.lookup(node)
	if !ok {
		return NodeIndexStats{}, false
	}
	n := &x.nodes[slot]
	return NodeIndexStats{Epoch: n.epoch, Seq: n.seq, Blocks: n.blocks, RefusedAdds: n.refused}, true
}

// Nodes returns the ids of the nodes with a snapshot, sorted.
func (x *Index) Nodes() []string {
	x.mu.RLock()
	out := make([]string, 0, len(x.slots.byID))
	for id := range x.slots.byID {
		out = append(out, id)
	}
	x.mu.RUnlock()
	sort.Strings(out)
	return out
}

// Stats returns the index's size and counters.
func (x *Index) Stats() IndexStats {
	x.mu.RLock()
	defer x.mu.RUnlock()
	st := IndexStats{Nodes: len(x.slots.byID), Pairs: x.pairs, MaxPairs: x.maxPairs, RefusedAdds: x.refused}
	for _, tb := range x.words {
		st.DistinctHashes += tb.len()
		st.ApproxBytes += tb.bytes()
	}
	st.ApproxBytes += int64(len(x.nodes)) * 64
	return st
}

// add sets slot's bit for h, refusing (and counting) when the index is full. Callers hold mu.
func (x *Index) add(slot int32, h uint64) {
	tb := x.words[slot>>6]
	bit := uint64(1) << (uint(slot) & 63)
	w := tb.get(h)
	if w&bit != 0 {
		return
	}
	if x.pairs >= x.maxPairs || (x.maxBytes > 0 && x.bytes+x.addBytes(tb, w) > x.maxBytes) {
		x.refused++
		x.nodes[slot].refused++
		return
	}
	before := tb.bytes()
	tb.set(h, w|bit)
	x.bytes += tb.bytes() - before
	x.pairs++
	x.nodes[slot].blocks++
}

// addBytes is what adding one more node to a hash whose mask is w would add to tb's footprint:
// the growth of the table when the hash is new and the table is at its load limit.
func (x *Index) addBytes(tb *bitTable, w uint64) int64 {
	if w != 0 {
		return 0
	}
	return tb.growBytes()
}

// remove clears slot's bit for h. Callers hold mu.
func (x *Index) remove(slot int32, h uint64) {
	tb := x.words[slot>>6]
	bit := uint64(1) << (uint(slot) & 63)
	w := tb.get(h)
	if w&bit == 0 {
		return
	}
	tb.set(h, w&^bit) // deletes the entry when no node is left
	x.pairs--
	x.nodes[slot].blocks--
}

// clearSlot drops every hash of slot. It scans the slot's word group — O(distinct hashes in the
// group) — instead of keeping a per-node list of hashes, which would double the memory per pair;
// snapshots and departures are rare next to deltas and estimates. Callers hold mu.
func (x *Index) clearSlot(slot int32) {
	n := &x.nodes[slot]
	if n.blocks == 0 {
		return
	}
	tb := x.words[slot>>6]
	before := tb.bytes()
	tb.clearBit(uint64(1) << (uint(slot) & 63))
	x.bytes += tb.bytes() - before
	x.pairs -= n.blocks
	n.blocks = 0
}
