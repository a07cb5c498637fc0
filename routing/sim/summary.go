package sim

import (
	"github.com/prefixmesh/prefixmesh/local"
	"github.com/prefixmesh/prefixmesh/local/kvpool"
)

// summary is what a node publishes to the routers: the set of its tree's visible blocks and,
// with a CPU tier, every block the tier holds under its tier key (local.TierKey(h,
// local.TierCPU)), added when its chunk enters the tier and removed when the chunk leaves. That
// is the summary a node agent mirroring vLLM's CPU offload events publishes (node/kvevents keeps
// one local.Journal for every tier), so the routers' indexes see the tier exactly as they would
// in a deployment.
//
// The node keeps one journal of its own, fed on every read from the tree's journal and the
// tier's recorded ops (kvpool.CPUTier.Ops), so a router sees one sequence of changes, detects a
// lost delta by its sequence numbers and repairs from one snapshot of both. Between two reads
// the tree's and the tier's changes concern different keys (a block's hash, its tier key), so
// copying the tree's first and the tier's after keeps each key's changes in order, which is all
// the summary, a set, depends on (routing.Index.ApplyDelta). Without a tier the journal holds
// exactly the tree's changes.
type summary struct {
	tree    *local.RadixTree
	cpu     *kvpool.CPUTier // nil without a CPU tier
	journal local.Journal
	// treeSeen is the tree's journal head already copied. floor is the first sequence number a
	// delta can start after: older readers missed changes the tree's journal no longer had and
	// must take a snapshot.
	treeSeen, floor uint64

	evs []local.SummaryEvent // scratch
	ops []kvpool.TierOp      // scratch
}

func newSummary(tree *local.RadixTree, cpu *kvpool.CPUTier) *summary {
	m := &summary{tree: tree, cpu: cpu}
	m.journal.Init(local.DefaultJournalCapacity) // the tree's own ring: a tierless node overflows as it did
	if cpu != nil {
		cpu.SetRecording(true)
	}
	return m
}

// sync copies the tree's and the tier's changes since the last sync into the journal.
func (m *summary) sync() {
	var head uint64
	var ok bool
	m.evs, head, ok = m.tree.SummarySince(m.treeSeen, m.evs[:0])
	if !ok {
		// The tree's journal overran since the last sync (one step changed more blocks than
		// it keeps): its lost changes cannot be replayed. A placeholder change marks the point
		// and every reader from before it takes a snapshot; no delta carries it.
		m.journal.Emit(0, false)
		m.floor = m.journal.Head()
	}
	m.treeSeen = head
	for _, e := range m.evs {
		m.journal.Emit(e.Hash, e.Added)
	}
	if m.cpu == nil {
		return
	}
	m.ops = m.cpu.Ops(m.ops[:0])
	for _, op := range m.ops {
		for _, h := range op.Hashes {
			m.journal.Emit(local.TierKey(h, local.TierCPU), !op.Removed)
		}
	}
	m.cpu.ResetOps()
}

// since appends every change after sequence number since to dst and returns the extended slice
// and the newest sequence number; ok is false when since is too old (or ahead), and the reader
// must take a snapshot.
func (m *summary) since(since uint64, dst []local.SummaryEvent) (events []local.SummaryEvent, head uint64, ok bool) {
	m.sync()
	if since < m.floor {
		return dst, m.journal.Head(), false
	}
	return m.journal.Since(since, dst)
}

// snapshot appends every key of the summary (the tree's visible blocks, then the tier's blocks'
// tier keys, in a deterministic order) and returns the sequence number it corresponds to.
func (m *summary) snapshot(dst []uint64) (keys []uint64, head uint64) {
	m.sync()
	dst, _ = m.tree.SummarySnapshot(dst)
	if m.cpu != nil {
		n := len(dst)
		dst = m.cpu.AppendHashes(dst)
		for i := n; i < len(dst); i++ {
			dst[i] = local.TierKey(dst[i], local.TierCPU)
		}
	}
	return dst, m.journal.Head()
}
