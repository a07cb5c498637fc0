package simengine

import (
	"context"
	"time"

	"github.com/prefixmesh/prefixmesh/local/kvpool"
)

// Leases: a finished prefill leg's blocks stay allocated for a decode engine to pull, as
// NixlConnector's request_finished delays freeing them on a prefill node
// (vllm/distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py: delay_free_blocks, the
// request kept in _reqs_need_send until now + kv_lease_duration). The lease holds the finished
// request's sequence itself (kvpool.Seq, not finished): its block table is what the response
// names in remote_block_ids, its references keep every one of those blocks allocated, and its
// hold on the cache keeps the prompt's full blocks from eviction. The sequence gives up its slot
// (it no longer runs) but not its blocks. A lease ends when a decode engine pulls (the side
// channel releases it after serving, as the decode's read notification frees the blocks in
// vLLM), when it expires, or when the engine closes; a puller that waits renews it (heartbeat).
//
// Leases are bounded by the pool: each holds at least one block.

// lease is one finished prefill leg's pinned blocks.
type lease struct {
	id      string      // remote_request_id
	seq     *kvpool.Seq // unfinished: holds the blocks
	tokens  []uint32    // the prompt
	adapter uint64
	blocks  []uint32 // the prompt's blocks, as named in remote_block_ids
	expires time.Time
}

// leaseLocked turns a prefill leg that finished into a lease: the request stops running (its
// slot frees and the queue may move) and its sequence's blocks stay held until releaseLocked.
// It returns the blocks the lease names. e.mu is held.
func (e *Engine) leaseLocked(tk *ticket, id string) []uint32 {
	bs := e.cfg.BlockSize
	prompt := (len(tk.tokens) + bs - 1) / bs
	l := &lease{id: id, seq: tk.seq, tokens: tk.tokens, adapter: tk.adapter,
		blocks: tk.seq.Blocks()[:prompt], expires: e.now().Add(e.cfg.KVLeaseDuration)}
	e.leases[id] = l
	e.running--
	e.removeSeqLocked(tk)
	tk.leased = true
	e.kickLocked()
	select { // the expiry loop may be sleeping towards a later deadline
	case e.leaseKick <- struct{}{}:
	default:
	}
	return l.blocks
}

// releaseLeaseLocked ends a lease: the sequence finishes and its blocks return to the pool (the
// full prompt blocks stay cached, evictable as any). e.mu is held.
func (e *Engine) releaseLeaseLocked(l *lease) {
	delete(e.leases, l.id)
	if err := l.seq.Finish(); err != nil {
		e.log.Error("kv pool finish", "err", err) // unreachable: a lease is released once
	}
	e.kickLocked() // blocks freed: a queued request may fit now
}

// expireLeasesLocked releases every lease whose time is up and returns the earliest deadline
// left (zero when none). e.mu is held.
func (e *Engine) expireLeasesLocked() time.Time {
	now := e.now()
	var next time.Time
	for _, l := range e.leases {
		if !now.Before(l.expires) {
			e.log.Debug("kv lease expired", "remote_request_id", l.id, "blocks", len(l.blocks))
			e.releaseLeaseLocked(l)
			e.met.leasesExpired.Inc()
			continue
		}
		if next.IsZero() || l.expires.Before(next) {
			next = l.expires
		}
	}
	return next
}

// renewLeasesLocked extends the named leases by a lease duration, as a prefill node renews
// them on a decode node's heartbeat (nixl/base_scheduler.py: heartbeats every
// kv_lease_duration // 6 while the decode waits). It returns how many it renewed.
func (e *Engine) renewLeasesLocked(ids []string) int {
	n := 0
	for _, id := range ids {
		if l, ok := e.leases[id]; ok && e.now().Before(l.expires) {
			l.expires = e.now().Add(e.cfg.KVLeaseDuration)
			n++
		}
	}
	return n
}

// leaseLoop expires leases on time. It sleeps until the earliest deadline or until a lease is
// added (leaseKick), and ends with ctx; Start starts it and Close joins it.
func (e *Engine) leaseLoop(ctx context.Context) {
	defer e.bg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		e.mu.Lock()
		next := e.expireLeasesLocked()
		e.mu.Unlock()
		wait := time.Hour // nothing leased: sleep until kicked
		if !next.IsZero() {
			wait = max(next.Sub(e.now()), time.Millisecond)
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-e.leaseKick:
		}
	}
}

// releaseAllLeasesLocked ends every lease (the engine is closing). e.mu is held.
func (e *Engine) releaseAllLeasesLocked() {
	for _, l := range e.leases {
		e.releaseLeaseLocked(l)
	}
}

// Leases is the number of prefill legs whose blocks are pinned for a decode engine.
func (e *Engine) Leases() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.leases)
}
