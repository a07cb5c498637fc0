package kvevents

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"
)

// Follower keeps a CacheMirror in step with an engine: one subscription per data-parallel rank, each
// a socket reader goroutine feeding one ordered applier goroutine (the live SUB and the replay
// DEALER never share a socket). The applier checks every sequence number: the next one is
// applied; a gap is replayed from the engine's replay socket (both reply layouts, with
// duplicates from the live queue dropped); a sequence that goes back means the engine restarted,
// so the rank's mirror is dropped and rebuilt (and Config.OnRestart told: a new epoch), and so
// does a gap whose replay answers with sequences below the one asked for (a new engine process
// answered). What each rank does is decided by its rank machine (rankmachine.go), a pure state
// machine; this file is its driver: the sockets, the replay exchanges and the idle timer.
//
// A rank is complete (exact) when its mirror saw every batch since the engine's first (seq 0,
// directly or by replay) or since an AllBlocksCleared. Otherwise it is partial: a lower bound of
// the engine's cache, never more, because every block in it was reported stored and not yet
// removed. A late join (the agent started or restarted after the engine published, or a
// publisher that counts from 1) with no replay reaching back is partial from the start; a gap
// that cannot be replayed, or a batch that cannot be decoded whole (a malformed event, or an
// event of an unknown kind that names blocks or has no readable tag), may have removed blocks,
// so the rank is cleared and rebuilt from there on, partial. An event of an unknown kind that
// names no blocks cannot have removed one: it is counted and skipped. Partial ranks are credited (their
// estimates are lower bounds); each time a rank becomes partial a line "kv events mirror partial
// because …" is logged and prefixmesh_kvevents_partial_total{reason} counted. A rank is cold
// (Cold, Config.OnComplete is told of changes) only while its mirror may hold blocks the engine
// no longer has: a mirror reloaded from a checkpoint (Config.Restore) until the follower knows
// what happened meanwhile: the gap since replayed (exact again), or found unreplayable (kept,
// partial, its copies provisional, and never dropped later merely because the engine is quiet
// and its buffer moved on), or the engine restarted (cleared).
type Follower struct {
	cfg    Config
	mirror *CacheMirror
	log    *slog.Logger
	met    *metrics
	ranks  []*rankState
	wg     sync.WaitGroup
	cancel context.CancelFunc
}

// rankState is one rank's subscription: its machine (owned by the rank's applier) and what the
// driver publishes of it for other goroutines.
type rankState struct {
	rank      int
	endpoint  string
	replay    string
	m         *rankMachine
	complete  atomic.Bool
	cold      atomic.Bool // the mirror may hold blocks the engine lost (a reloaded checkpoint)
	connected atomic.Bool
	r         string        // rank label
	restarted chan struct{} // EngineRestarted's signal to the applier (buffered, 1)
	met       rankMetrics
	idle      *time.Timer // the idle probe (the applier's)
}

// rankMetrics are the rank's series of the hot path, resolved once.
type rankMetrics struct {
	batches, fields prometheus.Counter
	events          [KindCleared + 1]prometheus.Counter
	lag             prometheus.Observer
	complete, cold  prometheus.Gauge
}

// NewFollower validates cfg and builds a follower over mirror; metrics go to reg when not nil.
func NewFollower(cfg Config, mirror *CacheMirror, logger *slog.Logger, reg prometheus.Registerer) (*Follower, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	met, err := newMetrics(reg, mirror)
	if err != nil {
		return nil, err
	}
	f := &Follower{cfg: cfg, mirror: mirror, log: logger, met: met}
	mirror.SetUnremovedTTL(cfg.UnremovedTierTTL)
	for r := 0; r < cfg.DPSize; r++ {
		ep, err := OffsetPort(cfg.Endpoint, r)
		if err != nil {
			return nil, fmt.Errorf("%w: rank %d: %v", ErrConfig, r, err)
		}
		rp := ""
		if cfg.Replay != "" {
			if rp, err = OffsetPort(cfg.Replay, r); err != nil {
				return nil, fmt.Errorf("%w: rank %d: %v", ErrConfig, r, err)
			}
		}
		label := strconv.Itoa(r)
		rs := &rankState{rank: r, endpoint: ep, replay: rp, r: label, restarted: make(chan struct{}, 1),
			m: newRankMachine(r, rp != "", cfg.IdleProbe)}
		rs.met = rankMetrics{batches: met.batches.WithLabelValues(label), fields: met.fields.WithLabelValues(label),
			lag: met.lag.WithLabelValues(label), complete: met.complete.WithLabelValues(label), cold: met.cold.WithLabelValues(label)}
		for k := KindUnknown; k <= KindCleared; k++ {
			rs.met.events[k] = met.events.WithLabelValues(label, k.String())
		}
		f.ranks = append(f.ranks, rs)
		met.initRank(label)
		if cfg.Restore != nil && r < len(cfg.Restore.Ranks) && cfg.Restore.Ranks[r].Have {
			// Cold until the machine's start knows what happened meanwhile. No hook yet: the
			// follower has not started.
			for _, a := range rs.m.restore(cfg.Restore.Ranks[r]) {
				f.setFlag(rs, a)
			}
		}
	}
	return f, nil
}

// Start opens every rank's subscription and returns; the goroutines run until ctx ends or Close.
func (f *Follower) Start(ctx context.Context) {
	ctx, f.cancel = context.WithCancel(ctx)
	for _, rs := range f.ranks {
		ch := make(chan zmq4.Msg, f.cfg.QueueLen)
		f.wg.Add(2)
		go func() { defer f.wg.Done(); f.read(ctx, rs, ch) }()
		go func() { defer f.wg.Done(); f.apply(ctx, rs, ch) }()
	}
}

// Close stops the subscriptions and waits for their goroutines.
func (f *Follower) Close() {
	if f.cancel != nil {
		f.cancel()
	}
	f.wg.Wait()
}

// Complete reports whether every rank's mirror has a clean baseline (see Follower).
func (f *Follower) Complete() bool {
	for _, rs := range f.ranks {
		if !rs.complete.Load() {
			return false
		}
	}
	return true
}

// Cold reports whether any rank's mirror may hold blocks its engine no longer has (see
// Follower): the node's summary may over-estimate, so routers take no affinity from it.
func (f *Follower) Cold() bool {
	for _, rs := range f.ranks {
		if rs.cold.Load() {
			return true
		}
	}
	return false
}

// Connected reports whether every rank's socket is dialled or bound.
func (f *Follower) Connected() bool {
	for _, rs := range f.ranks {
		if !rs.connected.Load() {
			return false
		}
	}
	return true
}

// read owns the rank's SUB socket: it dials (retrying until ctx ends) or binds, subscribes to the
// topic prefix and hands every message to the applier. When the connection ends (the engine
// went away) it opens a new socket and dials again; a restarted engine is then recognised by
// its sequence numbers. It closes ch when ctx ends.
func (f *Follower) read(ctx context.Context, rs *rankState, ch chan<- zmq4.Msg) {
	defer close(ch)
	for ctx.Err() == nil {
		// The socket lives on its own context: when ctx ends, its connections are closed and
		// the library's readers drained before the socket closes (zmtp.go), so none is left
		// blocked; the socket context ends at once when there is nothing to drain.
		conns := &connSet{}
		sctx, scancel := context.WithCancel(withConnSet(context.WithoutCancel(ctx), conns))
		stop := context.AfterFunc(ctx, func() {
			if conns.closeAll() == 0 {
				scancel()
				return
			}
			time.AfterFunc(drainTimeout, scancel)
		})
		sock, err := f.open(sctx, rs)
		if err != nil {
			if ctx.Err() == nil {
				f.log.Error("kv events socket", "rank", rs.rank, "endpoint", rs.endpoint, "listen", f.cfg.Listen, "err", err)
			}
		} else {
			rs.connected.Store(true)
			f.log.Info("kv events subscribed", "rank", rs.rank, "endpoint", rs.endpoint, "listen", f.cfg.Listen, "topic", f.cfg.Topic)
			f.receive(ctx, sctx, rs, sock, conns, ch)
			rs.connected.Store(false)
		}
		stop()
		conns.closeAll()
		scancel()
		if sock != nil {
			_ = sock.Close()
		}
		select {
		case <-ctx.Done():
		case <-time.After(f.cfg.RedialInterval):
		}
	}
}

// open returns a subscribed SUB socket, dialled (retrying every RedialInterval until ctx ends)
// or bound. The library's own reconnect is not used: it redials the socket's own endpoint even
// when bound, and races with Close; a new socket per connection is simpler and safe.
func (f *Follower) open(ctx context.Context, rs *rankState) (zmq4.Socket, error) {
	sock := zmq4.NewSub(ctx, zmq4.WithDialerRetry(f.cfg.RedialInterval), zmq4.WithDialerMaxRetries(-1))
	if err := sock.SetOption(zmq4.OptionSubscribe, f.cfg.Topic); err != nil {
		_ = sock.Close()
		return nil, err
	}
	var err error
	if f.cfg.Listen {
		err = sock.Listen(zmqEndpoint(rs.endpoint))
	} else {
		err = sock.Dial(zmqEndpoint(rs.endpoint))
	}
	if err != nil {
		_ = sock.Close()
		return nil, err
	}
	return sock, nil
}

// receive hands messages to the applier until the connection ends or ctx does. A bound socket
// (Listen) serves every peer that connects: one peer's connection ending (a stranger, or the
// engine itself before it reconnects) ends only that connection, never the engine's stream.
// Once ctx ends it drains the library's readers (see read) and returns.
func (f *Follower) receive(ctx, sctx context.Context, rs *rankState, sock zmq4.Socket, conns *connSet, ch chan<- zmq4.Msg) {
	ended := 0 // connections whose last (error) message was received
	for {
		msg, err := sock.Recv()
		if err != nil {
			if sctx.Err() != nil {
				return
			}
			ended++
			if ctx.Err() != nil {
				if ended >= conns.ready() {
					return // every reader handed over its last message
				}
				continue
			}
			if f.cfg.Listen {
				f.met.peerEnds.WithLabelValues(rs.r).Inc()
				f.log.Debug("kv events: a peer's connection ended; still listening", "rank", rs.rank, "endpoint", rs.endpoint, "err", err)
				continue
			}
			f.log.Warn("kv events connection ended; reconnecting", "rank", rs.rank, "endpoint", rs.endpoint, "err", err)
			return
		}
		if ctx.Err() != nil {
			continue // draining
		}
		select {
		case ch <- msg:
		case <-ctx.Done():
		}
	}
}

// EngineRestarted tells every rank that the engine restarted without a word on the stream (its
// process start time changed): each drops its mirror and waits for a new baseline. It does not
// block.
func (f *Follower) EngineRestarted() {
	for _, rs := range f.ranks {
		select {
		case rs.restarted <- struct{}{}:
		default: // one is already pending
		}
	}
}

// apply is the rank's ordered applier: it feeds the rank's machine its inputs (live batches,
// the idle timer, the restart signal) and executes what the machine answers, including the
// replay exchanges, whose answers go back to the machine.
func (f *Follower) apply(ctx context.Context, rs *rankState, ch <-chan zmq4.Msg) {
	// The idle probe backs off (doubling up to maxIdleProbe) while probes find nothing, so a
	// quiet engine is asked a few times a minute, not every IdleProbe; a batch resets it. The
	// machine says when to arm it; it starts stopped.
	rs.idle = time.NewTimer(time.Hour)
	rs.idle.Stop()
	defer rs.idle.Stop()
	f.run(ctx, rs, rs.m.Start())
	for {
		select {
		case <-ctx.Done():
			return
		case <-rs.idle.C:
			f.mirror.Expire() // a quiet engine's unremoved copies still age
			f.run(ctx, rs, rs.m.Tick(time.Now()))
		case <-rs.restarted:
			f.run(ctx, rs, rs.m.EngineRestarted())
		case msg, ok := <-ch:
			if !ok {
				return
			}
			if len(msg.Frames) != 3 {
				f.run(ctx, rs, rs.m.BadMessage())
				continue
			}
			seq, err := DecodeSeq(msg.Frames[1])
			if err != nil {
				f.run(ctx, rs, rs.m.BadMessage())
				continue
			}
			f.run(ctx, rs, rs.m.Live(seq, msg.Frames[2], time.Now()))
		}
	}
}

// run executes acts and, while they end with an exchange, performs it and executes the
// machine's answer to it.
func (f *Follower) run(ctx context.Context, rs *rankState, acts []action) {
	for {
		if len(acts) == 0 {
			return
		}
		last := acts[len(acts)-1]
		if last.kind != actReplay && last.kind != actProbe {
			f.exec(rs, acts)
			return
		}
		f.exec(rs, acts[:len(acts)-1])
		rctx, cancel := context.WithTimeout(ctx, f.cfg.ReplayTimeout)
		if last.kind == actProbe {
			first, n, complete, err := Replay(rctx, rs.replay, last.seq, rs.m.ProbeItem)
			cancel()
			acts = rs.m.ProbeDone(first, n, complete, err, time.Now())
			continue
		}
		first, _, complete, err := Replay(rctx, rs.replay, last.seq, func(seq uint64, payload []byte) error {
			acts, err := rs.m.ReplayItem(seq, payload, time.Now())
			f.exec(rs, acts)
			return err
		})
		cancel()
		if err != nil && !isErr(err, errRestarted) && !isErr(err, errShort) && !isErr(err, errHole) {
			err = fmt.Errorf("%s: %w", rs.replay, err) // the log line names the endpoint
		}
		acts = rs.m.ReplayDone(first, complete, err, time.Now())
	}
}

// exec executes actions that need no exchange, in order.
func (f *Follower) exec(rs *rankState, acts []action) {
	for i := range acts {
		a := &acts[i]
		switch a.kind {
		case actApply:
			for j := a.lo; j < a.hi; j++ {
				ev := &a.batch.Events[j]
				f.mirror.Apply(rs.rank, ev)
				rs.met.events[ev.Kind].Inc()
			}
			f.mirror.Expire()
		case actClear:
			f.mirror.Clear(rs.rank)
		case actRecordSeq:
			f.mirror.setSeq(rs.rank, a.pos)
		case actConfirm:
			f.mirror.ConfirmRestored(rs.rank)
		case actSetComplete, actSetCold:
			f.setFlag(rs, *a)
		case actNotifyComplete:
			if f.cfg.OnComplete != nil {
				f.cfg.OnComplete(rs.rank, a.flag)
			}
		case actNotifyRestart:
			if f.cfg.OnRestart != nil {
				f.cfg.OnRestart(rs.rank)
			}
		case actCount:
			f.counter(rs, a.metric, a.label).Add(float64(a.n))
		case actLag:
			rs.met.lag.Observe(a.f)
		case actLog:
			f.log.Log(context.Background(), a.level, a.msg, append([]any{"rank", rs.rank}, a.args...)...)
		case actArmProbe:
			if !rs.idle.Stop() {
				select {
				case <-rs.idle.C:
				default:
				}
			}
			rs.idle.Reset(a.dur)
		}
	}
}

// setFlag publishes a completeness or coldness flag: the atomic read by Complete and Cold, and
// the gauge.
func (f *Follower) setFlag(rs *rankState, a action) {
	v := 0.0
	if a.flag {
		v = 1
	}
	if a.kind == actSetCold {
		rs.cold.Store(a.flag)
		rs.met.cold.Set(v)
		return
	}
	rs.complete.Store(a.flag)
	rs.met.complete.Set(v)
}

func (f *Follower) counter(rs *rankState, id metricID, label string) prometheus.Counter {
	switch id {
	case mBatches:
		return rs.met.batches
	case mFields:
		return rs.met.fields
	case mSkipped:
		return f.met.skipped.WithLabelValues(rs.r, label)
	case mDecodeErrs:
		return f.met.decodeErrs.WithLabelValues(rs.r)
	case mGaps:
		return f.met.gaps.WithLabelValues(rs.r)
	case mReplays:
		return f.met.replays.WithLabelValues(rs.r, label)
	case mResyncs:
		return f.met.resyncs.WithLabelValues(rs.r, label)
	case mPartial:
		return f.met.partial.WithLabelValues(rs.r, label)
	default: // mLossy
		return f.met.lossy.WithLabelValues(rs.r)
	}
}
