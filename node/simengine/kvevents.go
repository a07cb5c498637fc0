package simengine

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/prefixmesh/prefixmesh/local"
	"github.com/prefixmesh/prefixmesh/local/kvpool"
	"github.com/prefixmesh/prefixmesh/node/kvevents"
)

// eventPublisher turns the engine's cache changes into vLLM KV events. After every pool
// operation the engine (holding its lock) reads the tree's summary journal since the last
// publish: a block that became visible is a BlockStored (chained by parent hash, with its
// tokens, consecutive blocks of one insert in one event, as vLLM's cache_full_blocks), one that
// was evicted is a BlockRemoved (one per block, as vLLM's evictions). The published hashes are
// the canonical hashes mixed with a per-engine secret, so they are opaque to the subscriber (as
// vLLM's sha256 hashes are) and a mirror that confused them with canonical hashes would fail.
//
// The CPU tier's changes (kvpool.CPUTier's recorded ops) go first in the same batch, in the order they happened, as
// vLLM ≥ 0.24 writes them with self_describing_kv_events
// (vllm/distributed/kv_transfer/kv_connector/v1/offloading/events.py): a stored chunk is one
// BlockStored with medium "CPU" naming the chunk's constituent per-block hashes, the whole
// chunk's token ids, the GPU block size, the hash of the block before the chunk as parent (none
// for a chain's first chunk) and the LoRA name; an evicted chunk is one BlockRemoved with
// medium "CPU" naming the same hashes. They precede the GPU's removals because a chunk spills
// while its blocks, and the block its parent hash names, are still on the GPU (vLLM stores a
// chunk while the request runs, long before the GPU evicts it), so a mirror can always place it.
type eventPublisher struct {
	pub    *kvevents.Publisher
	tree   *local.RadixTree
	bs     int
	mix    uint64
	since  uint64
	log    *slog.Logger
	hashes []uint64
	evs    []local.SummaryEvent
	out    []kvevents.Event
	cpuHs  []uint64 // the CPU ops' published hashes, which their events' Hashes slice
	cpuOps []kvpool.TierOp
	lost   uint64
}

func newEventPublisher(ctx context.Context, cfg kvevents.PublisherConfig, tree *local.RadixTree, bs int, log *slog.Logger) (*eventPublisher, error) {
	p, err := kvevents.NewPublisher(ctx, cfg, log.With("component", "kvevents-publisher"))
	if err != nil {
		return nil, err
	}
	return &eventPublisher{pub: p, tree: tree, bs: bs, mix: rand.Uint64() | 1, since: tree.SummaryHead(), log: log}, nil
}

// engineHash is the published hash of a canonical block hash.
func (p *eventPublisher) engineHash(h uint64) uint64 { return h ^ p.mix }

// publishLocked publishes the journal's changes since the last call; tokens and adapter are the
// prompt just inserted (nil when the change can only be evictions). e.mu is held.
func (e *Engine) publishLocked(tokens []uint32, adapter uint64) {
	p := e.events
	if p == nil {
		return
	}
	var ok bool
	p.evs, p.since, ok = p.tree.SummarySince(p.since, p.evs[:0])
	if !ok { // unreachable: the journal is read after every change, far below its capacity
		p.lost++
		p.log.Error("kv events: summary journal overran; publishing AllBlocksCleared", "lost", p.lost)
		p.pub.Publish(float64(time.Now().UnixNano())/1e9, []kvevents.Event{{Kind: kvevents.KindCleared}})
		if e.cpu != nil { // the CPU tier's held chunks are lost to the mirror too until re-stored
			e.cpu.ResetOps()
		}
		return
	}
	p.out = p.appendCPU(p.out[:0], e.cpu)
	if len(p.evs) == 0 {
		if len(p.out) > 0 {
			p.pub.Publish(float64(time.Now().UnixNano())/1e9, p.out)
		}
		return
	}
	bs := p.bs
	if tokens != nil {
		p.hashes = local.AppendBlockHashes(p.hashes[:0], tokens, bs, adapter)
	} else {
		p.hashes = p.hashes[:0]
	}
	j := 0        // position in the prompt's hashes: inserts add blocks in prompt order
	runFirst := 0 // the first block of the last BlockStored's run
	for _, ev := range p.evs {
		if !ev.Added {
			p.out = append(p.out, kvevents.Event{Kind: kvevents.KindRemoved, Hashes: []uint64{p.engineHash(ev.Hash)}})
			continue
		}
		k := j
		for k < len(p.hashes) && p.hashes[k] != ev.Hash {
			k++
		}
		if k == len(p.hashes) { // not from this insert (unreachable): cannot name its tokens
			p.lost++
			p.log.Error("kv events: a block became visible outside an insert", "hash", ev.Hash)
			continue
		}
		if n := len(p.out); n > 0 && p.out[n-1].Kind == kvevents.KindStored && p.out[n-1].Tier == kvevents.TierGPU && k == j && k > 0 &&
			p.out[n-1].Hashes[len(p.out[n-1].Hashes)-1] == p.engineHash(p.hashes[k-1]) {
			last := &p.out[n-1] // extends the previous event's run
			last.Hashes = append(last.Hashes, p.engineHash(ev.Hash))
			last.Tokens = tokens[runFirst*bs : (k+1)*bs]
		} else {
			st := kvevents.Event{Kind: kvevents.KindStored, Hashes: []uint64{p.engineHash(ev.Hash)},
				Tokens: tokens[k*bs : (k+1)*bs], BlockSize: bs, LoRAName: loraName(adapter)}
			if k > 0 {
				st.Parent, st.HasParent = p.engineHash(p.hashes[k-1]), true
			}
			p.out = append(p.out, st)
			runFirst = k
		}
		j = k + 1
	}
	p.pub.Publish(float64(time.Now().UnixNano())/1e9, p.out)
}

// appendCPU appends the CPU tier's recorded changes as vLLM's self-describing offload events
// and forgets them. The events' hashes live in p.cpuHs, filled before any event slices it; their
// tokens alias the tier's op buffer, which nothing appends to before this publish has encoded
// them (both under the engine's mutex).
func (p *eventPublisher) appendCPU(out []kvevents.Event, t *kvpool.CPUTier) []kvevents.Event {
	if t == nil {
		return out
	}
	p.cpuOps = t.Ops(p.cpuOps[:0])
	if len(p.cpuOps) == 0 {
		return out
	}
	p.cpuHs = p.cpuHs[:0]
	for _, op := range p.cpuOps {
		for _, h := range op.Hashes {
			p.cpuHs = append(p.cpuHs, p.engineHash(h))
		}
	}
	h0 := 0
	for _, op := range p.cpuOps {
		h1 := h0 + len(op.Hashes)
		ev := kvevents.Event{Kind: kvevents.KindStored, Tier: kvevents.TierCPU, Hashes: p.cpuHs[h0:h1]}
		h0 = h1
		if op.Removed {
			ev.Kind = kvevents.KindRemoved
		} else {
			ev.Tokens, ev.BlockSize, ev.LoRAName = op.Tokens, p.bs, loraName(op.Adapter)
			if op.HasParent {
				ev.Parent, ev.HasParent = p.engineHash(op.Parent), true
			}
		}
		out = append(out, ev)
	}
	t.ResetOps()
	return out
}

// loraName is the name the published events give an adapter: its decimal id, which
// kvevents.AdapterID maps back to the same id (as a vLLM LoRA module named by its id would).
func loraName(adapter uint64) string {
	if adapter == 0 {
		return ""
	}
	return strconv.FormatUint(adapter, 10)
}
