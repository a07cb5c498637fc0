package kvevents

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"
)

// Follower keeps a Mirror in step with an engine: one subscription per data-parallel rank, each
// a socket reader goroutine feeding one ordered applier goroutine (the live SUB and the replay
// DEALER never share a socket). The applier checks every sequence number: the next one is
// applied; a gap is replayed from the engine's replay socket (both reply layouts, with
// duplicates from the live queue dropped); a sequence that goes back means the engine restarted,
// so the rank's mirror is dropped and rebuilt (and Config.OnRestart told: a new epoch).
//
// A rank is complete (exact) when its mirror saw every batch since the engine's first (seq 0,
// directly or by replay) or since an AllBlocksCleared. Otherwise it is partial: a lower bound of
// the engine's cache, never more, because every block in it was reported stored and not yet
// removed. A late join (the agent started or restarted after the engine published, or a
// publisher that counts from 1) with no replay reaching back is partial from the start; a gap
// that cannot be replayed, or a batch that cannot be decoded whole, may have removed blocks, so
// the rank is cleared and rebuilt from there on, partial. Partial ranks are credited (their
// estimates are lower bounds); each time a rank becomes partial a line "kv events mirror partial
// because …" is logged and prefixmesh_kvevents_partial_total{reason} counted. A rank is cold
// (Cold, Config.OnComplete is told of changes) only while its mirror may hold blocks the engine
// no longer has: a mirror reloaded from a checkpoint (Config.Checkpoint) until the gap since
// is replayed or the rank is cleared.
type Follower struct {
	cfg    Config
	mirror *Mirror
	log    *slog.Logger
	met    *metrics
	ranks  []*rankState
	wg     sync.WaitGroup
	cancel context.CancelFunc
}

// rankState is one rank's subscription; its fields are owned by that rank's applier.
type rankState struct {
	rank      int
	endpoint  string
	replay    string
	have      bool   // a batch of the current engine incarnation was applied
	last      uint64 // its sequence number
	dupFloor  uint64 // live batches in (dupFloor, last] are duplicates of replayed ones
	complete  atomic.Bool
	cold      atomic.Bool // the mirror may hold blocks the engine lost (a reloaded checkpoint)
	connected atomic.Bool
	dec       *Decoder
	// rebuild: the mirror was just cleared as partial (the reason told); the next batch starts
	// it again without another replay from 0.
	rebuild bool
	// restored: the rank starts from a checkpoint (sum is its last batch's xxhash), to be
	// verified before anything else; acceptGap: the gap since it could not be replayed, so the
	// next live batch continues the partial mirror instead of clearing it.
	restored, acceptGap bool
	sum                 uint64
	r                   string        // rank label
	restarted           chan struct{} // EngineRestarted's signal to the applier (buffered, 1)
}

// NewFollower validates cfg and builds a follower over mirror; metrics go to reg when not nil.
func NewFollower(cfg Config, mirror *Mirror, logger *slog.Logger, reg prometheus.Registerer) (*Follower, error) {
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
		f.ranks = append(f.ranks, &rankState{rank: r, endpoint: ep, replay: rp, dec: NewDecoder(), r: strconv.Itoa(r),
			restarted: make(chan struct{}, 1)})
		met.initRank(strconv.Itoa(r))
		if cfg.Restore != nil && r < len(cfg.Restore.Ranks) && cfg.Restore.Ranks[r].Have {
			rs, ck := f.ranks[r], cfg.Restore.Ranks[r]
			rs.have, rs.last, rs.dupFloor, rs.sum, rs.restored = true, ck.Last, ck.Last, ck.Sum, true
			rs.complete.Store(ck.Complete)
			rs.cold.Store(true) // until verifyRestored knows what happened meanwhile
			if ck.Complete {
				met.complete.WithLabelValues(rs.r).Set(1)
			}
			met.cold.WithLabelValues(rs.r).Set(1)
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

// apply is the rank's ordered applier.
func (f *Follower) apply(ctx context.Context, rs *rankState, ch <-chan zmq4.Msg) {
	// The idle probe backs off (doubling up to maxIdleProbe) while probes find nothing, so a
	// quiet engine is asked a few times a minute, not every IdleProbe; a batch resets it.
	if rs.restored {
		f.verifyRestored(ctx, rs)
	}
	every := f.cfg.IdleProbe
	idle := time.NewTimer(every)
	defer idle.Stop()
	for {
		var msg zmq4.Msg
		var ok bool
		select {
		case <-ctx.Done():
			return
		case <-idle.C:
			// Quiet: batches lost at the tail (or, before the first live batch, everything the
			// engine published before the subscription took) show up only in the replay buffer.
			found := false
			switch {
			case rs.replay == "":
			case rs.have:
				found = f.probeTail(ctx, rs)
			case f.replayFrom(ctx, rs, 0) == replayOK:
				// The buffer reaches back to seq 0, or is empty because the engine has published
				// nothing yet (its buffer only ever drops its oldest batches): a clean baseline.
				found = rs.have || !rs.complete.Load()
				f.setComplete(rs, true)
			}
			every = nextIdleProbe(every, f.cfg.IdleProbe, found)
			idle.Reset(every)
			continue
		case <-rs.restarted:
			f.log.Warn("engine restarted: dropping the mirror", "rank", rs.rank)
			f.reset(rs, "restart", "")
			continue
		case msg, ok = <-ch:
			if !ok {
				return
			}
		}
		if len(msg.Frames) != 3 {
			f.met.decodeErrs.WithLabelValues(rs.r).Inc()
			continue
		}
		seq, err := DecodeSeq(msg.Frames[1])
		if err != nil {
			f.met.decodeErrs.WithLabelValues(rs.r).Inc()
			continue
		}
		f.live(ctx, rs, seq, msg.Frames[2])
		if !idle.Stop() {
			select {
			case <-idle.C:
			default:
			}
		}
		every = f.cfg.IdleProbe
		idle.Reset(every)
	}
}

// probeTail checks a quiet rank against the engine's replay buffer. It first asks from the last
// batch applied: the engine's buffer only ever drops its oldest batches, so an empty answer
// means the engine's sequence started over below it (a restart whose first batches were lost),
// and a first batch after it means the buffer moved past it. Otherwise it replays whatever came
// after the last batch (published and lost at the tail); live duplicates are dropped. It
// reports whether the probe found anything to do (the idle probe backs off while it does not).
func (f *Follower) probeTail(ctx context.Context, rs *rankState) bool {
	before := rs.last
	rctx, cancel := context.WithTimeout(ctx, f.cfg.ReplayTimeout)
	first, n, complete, err := Replay(rctx, rs.replay, before, func(uint64, []byte) error { return errStop })
	cancel()
	switch {
	case err == nil && complete && n == 0:
		f.log.Warn("kv events: the engine's replay buffer no longer holds the last batch applied: it restarted; dropping the mirror", "rank", rs.rank, "last", before)
		f.reset(rs, "restart", "")
		return true
	case errors.Is(err, errStop) && first > before:
		f.reset(rs, "gap", "batches after sequence "+strconv.FormatUint(before, 10)+" were lost and the replay buffer no longer holds them")
		return true
	case !errors.Is(err, errStop):
		f.log.Debug("kv events idle probe", "rank", rs.rank, "err", err)
		return false
	}
	switch f.replayFrom(ctx, rs, before+1) {
	case replayOK:
		if rs.last > before {
			f.met.gaps.WithLabelValues(rs.r).Inc()
			rs.dupFloor = before
			f.log.Info("kv events: replayed batches lost at the tail", "rank", rs.rank, "after", before, "batches", rs.last-before)
			return true
		}
		return false
	case replayShort:
		f.reset(rs, "gap", "batches after sequence "+strconv.FormatUint(before, 10)+" were lost and the replay buffer no longer holds them")
	case replayRestarted:
		f.log.Warn("kv events: the engine restarted (its replay buffer starts over); dropping the mirror", "rank", rs.rank)
		f.reset(rs, "restart", "")
	case replayFailed: // logged; the next live batch or probe tries again
		return false
	}
	return true
}

// lossy handles a batch that did not decode whole (see applyBatch): a gap, counted, then a
// partial rebuild that continues with the next batch.
func (f *Follower) lossy(rs *rankState, seq uint64, what string) {
	f.met.gaps.WithLabelValues(rs.r).Inc()
	f.met.lossy.WithLabelValues(rs.r).Inc()
	f.mirror.Clear(rs.rank)
	f.partial(rs, "decode", "batch "+strconv.FormatUint(seq, 10)+" was not applied whole ("+what+")")
	f.met.resyncs.WithLabelValues(rs.r, "decode").Inc()
}

// verifyRestored settles a rank restored from a checkpoint before its first live batch. The
// replay socket is asked for the checkpoint's last batch: the same bytes mean the same engine
// incarnation, and the gap since is replayed (exact, or as partial as before, and no longer
// cold); other bytes, or a buffer that starts over, mean the engine restarted (the checkpoint
// is dropped); a buffer that moved past it, no replay socket or no answer leave the restored
// mirror partial with provisional copies (see Mirror), credited and no longer cold.
func (f *Follower) verifyRestored(ctx context.Context, rs *rankState) {
	rs.restored = false
	if rs.replay == "" {
		f.restoredPartial(rs, "there is no replay socket to replay what the engine did meanwhile")
		return
	}
	last := rs.last
	rctx, cancel := context.WithTimeout(ctx, f.cfg.ReplayTimeout)
	first, n, complete, err := Replay(rctx, rs.replay, last, func(seq uint64, p []byte) error {
		if seq == last && xxhash.Sum64(p) != rs.sum {
			return errOtherEngine
		}
		return errStop
	})
	cancel()
	switch {
	case errors.Is(err, errOtherEngine) || (err == nil && complete && n == 0):
		f.log.Warn("kv events: the engine restarted while the agent was down: dropping the checkpoint", "rank", rs.rank, "last", last)
		f.reset(rs, "restart", "")
	case errors.Is(err, errStop) && first == last:
		switch f.replayFrom(ctx, rs, last+1) {
		case replayOK:
			rs.dupFloor = last
			f.mirror.ConfirmRestored(rs.rank)
			f.setCold(rs, false)
			f.log.Info("kv events: restored from the checkpoint and replayed the gap", "rank", rs.rank, "from", last+1, "batches", rs.last-last)
		case replayRestarted:
			f.reset(rs, "restart", "")
		default:
			f.restoredPartial(rs, "the gap since the checkpoint could not be replayed")
		}
	case errors.Is(err, errStop):
		f.restoredPartial(rs, "the engine's replay buffer no longer reaches back to the checkpoint")
	default:
		f.restoredPartial(rs, "the replay socket did not answer ("+fmt.Sprint(err)+")")
	}
}

// restoredPartial keeps a restored mirror as partial: its provisional copies are credited until
// the engine removes them, and one the engine evicted meanwhile is corrected when it stores the
// block again; the next live batch continues it whatever its sequence.
func (f *Follower) restoredPartial(rs *rankState, why string) {
	rs.acceptGap = true
	f.partial(rs, "checkpoint", "it was restored from a checkpoint and "+why)
}

var errOtherEngine = errors.New("the replayed batch differs from the checkpoint's")

// nextIdleProbe is the idle probe's next interval: back to base after a probe that found
// something, else doubled up to maxIdleProbe (or base, when that is longer).
func nextIdleProbe(every, base time.Duration, found bool) time.Duration {
	if found {
		return base
	}
	return min(2*every, max(base, maxIdleProbe))
}

// maxIdleProbe caps the idle probe's back-off: a quiet engine's replay socket is asked at
// least every 32 s, so a batch lost at the tail of a burst is found within that.
const maxIdleProbe = 32 * time.Second

// errStop ends a replay exchange early (probeTail looks at the first batch only).
var errStop = errors.New("enough")

// live handles one live batch by its sequence number.
func (f *Follower) live(ctx context.Context, rs *rankState, seq uint64, payload []byte) {
	switch {
	case rs.have && seq == rs.last+1:
		rs.dupFloor = seq
		f.applyBatch(rs, seq, payload)
	case rs.have && seq <= rs.last && seq > rs.dupFloor:
		// Queued while a replay delivered it: a duplicate.
	case rs.have && seq <= rs.last:
		f.log.Warn("kv events sequence went back: engine restarted; dropping the mirror", "rank", rs.rank, "last", rs.last, "seq", seq)
		f.reset(rs, "restart", "")
		f.baseline(ctx, rs, seq, payload)
	case rs.have: // a gap
		f.met.gaps.WithLabelValues(rs.r).Inc()
		f.log.Info("kv events gap", "rank", rs.rank, "last", rs.last, "seq", seq)
		from := rs.last + 1
		if f.replayFrom(ctx, rs, from) == replayOK && rs.last >= seq {
			rs.dupFloor = from - 1
			return // the replay covered this batch too
		}
		if rs.have && rs.last+1 == seq {
			rs.dupFloor = seq
			f.applyBatch(rs, seq, payload)
			return
		}
		if rs.acceptGap { // the checkpoint's gap, already told: continue the partial mirror
			rs.acceptGap = false
			rs.dupFloor = seq
			f.applyBatch(rs, seq, payload)
			return
		}
		f.reset(rs, "gap", "batches "+strconv.FormatUint(from, 10)+" to "+strconv.FormatUint(seq-1, 10)+" were lost and could not be replayed")
		rs.have, rs.last, rs.dupFloor = true, seq, seq
		f.applyBatch(rs, seq, payload)
	default:
		f.baseline(ctx, rs, seq, payload)
	}
}

// baseline starts a rank's stream at seq: from the engine's first batch it is complete; later,
// replay from 0 is tried, and failing that the mirror is built from here on, partial (a lower
// bound). Right after a partial reset (rs.rebuild) the reason is already told and replay from 0
// is not tried again.
func (f *Follower) baseline(ctx context.Context, rs *rankState, seq uint64, payload []byte) {
	rebuild := rs.rebuild
	rs.rebuild = false
	rs.have, rs.last, rs.dupFloor = false, 0, 0
	if seq == 0 {
		f.setComplete(rs, true)
		rs.have, rs.last, rs.dupFloor = true, 0, 0
		f.applyBatch(rs, seq, payload)
		return
	}
	if !rebuild {
		if f.replayFrom(ctx, rs, 0) == replayOK && rs.last >= seq {
			f.setComplete(rs, true)
			rs.dupFloor = 0
			return
		}
		if rs.have && rs.last+1 == seq {
			f.setComplete(rs, true)
			rs.dupFloor = seq
			f.applyBatch(rs, seq, payload)
			return
		}
		// Joined late and replay cannot reach the first batch: what the engine cached before
		// is unknown, but every block reported from here on is real, so estimates are a lower
		// bound until a clean baseline.
		f.mirror.Clear(rs.rank)
		why := "its first batch has sequence " + strconv.FormatUint(seq, 10) +
			" (the agent started after the engine published, or the publisher counts from 1)"
		if rs.replay == "" {
			why += " and there is no replay socket"
		} else {
			why += " and replay does not reach back to sequence 0"
		}
		f.partial(rs, "late_join", why)
		f.met.resyncs.WithLabelValues(rs.r, "start").Inc() // counted once the rank reads incomplete
	}
	rs.have, rs.last, rs.dupFloor = true, seq, seq
	f.applyBatch(rs, seq, payload)
}

// partial marks the rank partial: a lower bound of the engine's cache, credited, never cold.
func (f *Follower) partial(rs *rankState, reason, why string) {
	f.log.Warn("kv events mirror partial because "+why+": its estimates are a lower bound until the engine clears its cache or restarts",
		"rank", rs.rank, "reason", reason)
	f.met.partial.WithLabelValues(rs.r, reason).Inc()
	f.setComplete(rs, false)
	f.setCold(rs, false)
}

// setCold records whether the rank's mirror may hold blocks the engine lost; OnComplete is
// told of a change (the node agent gossips Cold).
func (f *Follower) setCold(rs *rankState, cold bool) {
	v := 0.0
	if cold {
		v = 1
	}
	f.met.cold.WithLabelValues(rs.r).Set(v)
	if was := rs.cold.Swap(cold); was != cold && f.cfg.OnComplete != nil {
		f.cfg.OnComplete(rs.rank, rs.complete.Load())
	}
}

func (f *Follower) setComplete(rs *rankState, ok bool) {
	if ok {
		f.setCold(rs, false)
	}
	was := rs.complete.Swap(ok)
	v := 0.0
	if ok {
		v = 1
	}
	f.met.complete.WithLabelValues(rs.r).Set(v)
	if was != ok && f.cfg.OnComplete != nil {
		f.cfg.OnComplete(rs.rank, ok)
	}
}

// reset drops the rank's mirror; its removals reach routers through the summary journal. After
// an engine restart (cause "restart", why "") OnRestart is told, once the mirror is clear, and
// the next batch is a new baseline. Any other cause says why the mirror may have missed
// removals: the rank is rebuilt from the next batch on, partial.
func (f *Follower) reset(rs *rankState, cause, why string) {
	f.mirror.Clear(rs.rank)
	f.mirror.setSeq(rs.rank, RankSeq{})
	rs.have, rs.last, rs.dupFloor, rs.acceptGap = false, 0, 0, false
	if why != "" {
		f.partial(rs, cause, why)
		rs.rebuild = true
	} else {
		f.setComplete(rs, false)
		f.setCold(rs, false)
		rs.rebuild = false
	}
	// Counted after the rank reads incomplete, so whoever sees the resync sees it partial too.
	f.met.resyncs.WithLabelValues(rs.r, cause).Inc()
	if cause == "restart" && f.cfg.OnRestart != nil {
		f.cfg.OnRestart(rs.rank)
	}
}

// applyBatch decodes and applies one batch, recording it as the last applied. A batch that does
// not decode whole (a decode error, or a malformed or unknown event in it) may have removed
// blocks the mirror still holds: it is a gap that no replay can fill (the engine's buffer holds
// the same bytes), so the rank is cleared and rebuilt from here on, partial, keeping what did
// decode in this batch.
func (f *Follower) applyBatch(rs *rankState, seq uint64, payload []byte) {
	rs.have, rs.last = true, seq
	b, err := rs.dec.Decode(seq, payload)
	if err != nil {
		f.met.decodeErrs.WithLabelValues(rs.r).Inc()
		f.log.Debug("kv events decode", "rank", rs.rank, "seq", seq, "err", err)
		f.lossy(rs, seq, "it could not be decoded: "+err.Error())
		return
	}
	if b.Malformed > 0 || b.Unknown > 0 {
		f.lossy(rs, seq, fmt.Sprintf("it held %d malformed and %d unknown events", b.Malformed, b.Unknown))
	}
	for i := range b.Events {
		ev := &b.Events[i]
		f.mirror.Apply(rs.rank, ev)
		f.met.events.WithLabelValues(rs.r, ev.Kind.String()).Inc()
		if ev.Kind == KindCleared && b.Malformed == 0 && b.Unknown == 0 {
			f.setComplete(rs, true) // the engine's cache is empty: the mirror is exact again
		}
	}
	if b.Unknown > 0 {
		f.met.skipped.WithLabelValues(rs.r, "unknown_tag").Add(float64(b.Unknown))
	}
	if b.Malformed > 0 {
		f.met.skipped.WithLabelValues(rs.r, "malformed").Add(float64(b.Malformed))
	}
	if b.Fields > 0 {
		f.met.fields.WithLabelValues(rs.r).Add(float64(b.Fields))
	}
	f.met.batches.WithLabelValues(rs.r).Inc()
	f.mirror.setSeq(rs.rank, RankSeq{Have: true, Last: seq, Sum: xxhash.Sum64(payload), Complete: rs.complete.Load()})
	if b.TS > 0 {
		if lag := time.Since(time.Unix(0, int64(b.TS*1e9))); lag >= 0 {
			f.met.lag.WithLabelValues(rs.r).Observe(lag.Seconds())
		}
	}
}
