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

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"
)

// Follower keeps a Mirror in step with an engine: one subscription per data-parallel rank, each
// a socket reader goroutine feeding one ordered applier goroutine (DESIGN.md §9; the live SUB and
// the replay DEALER never share a socket). The applier checks every sequence number: the next
// one is applied; a gap is replayed from the engine's replay socket (both reply layouts, with
// duplicates from the live queue dropped); a sequence that goes back means the engine restarted,
// so the rank's mirror is dropped and rebuilt; a gap that cannot be replayed, or a first message
// after seq 0 that replay cannot reach back to, clears the rank and marks it incomplete (cold)
// until an AllBlocksCleared or a restart gives it a clean baseline again.
type Follower struct {
	cfg    Config
	mirror *Mirror
	log    *slog.Logger
	met    *metrics
	ranks  []*rankState
	wg     sync.WaitGroup
	cancel context.CancelFunc
	// OnReset, when set before Start, is called (from an applier goroutine) after a rank's mirror
	// was dropped because the engine restarted or the stream could not be recovered.
	OnReset func(rank int, cause string)
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
	connected atomic.Bool
	dec       *Decoder
	r         string        // rank label
	restarted chan struct{} // EngineRestarted's signal to the applier (buffered, 1)
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
		met.complete.WithLabelValues(strconv.Itoa(r)).Set(0)
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
// topic prefix and hands every message to the applier. It closes ch when it returns.
func (f *Follower) read(ctx context.Context, rs *rankState, ch chan<- zmq4.Msg) {
	defer close(ch)
	sock := zmq4.NewSub(ctx, zmq4.WithAutomaticReconnect(true), zmq4.WithDialerRetry(f.cfg.RedialInterval),
		zmq4.WithDialerMaxRetries(-1))
	defer sock.Close()
	if err := sock.SetOption(zmq4.OptionSubscribe, f.cfg.Topic); err != nil {
		f.log.Error("kv events subscribe", "rank", rs.rank, "err", err)
		return
	}
	var err error
	if f.cfg.Listen {
		err = sock.Listen(rs.endpoint)
	} else {
		err = sock.Dial(rs.endpoint) // retries every RedialInterval until ctx ends
	}
	if err != nil {
		if ctx.Err() == nil {
			f.log.Error("kv events socket", "rank", rs.rank, "endpoint", rs.endpoint, "listen", f.cfg.Listen, "err", err)
		}
		return
	}
	rs.connected.Store(true)
	f.log.Info("kv events subscribed", "rank", rs.rank, "endpoint", rs.endpoint, "listen", f.cfg.Listen, "topic", f.cfg.Topic)
	for {
		msg, err := sock.Recv()
		if err != nil {
			if ctx.Err() == nil {
				f.log.Warn("kv events receive", "rank", rs.rank, "err", err)
			}
			return
		}
		select {
		case ch <- msg:
		case <-ctx.Done():
			return
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
	for {
		var msg zmq4.Msg
		var ok bool
		select {
		case <-ctx.Done():
			return
		case <-rs.restarted:
			f.log.Warn("engine restarted: dropping the mirror", "rank", rs.rank)
			f.reset(rs, "restart")
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
	}
}

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
		f.reset(rs, "restart")
		f.baseline(ctx, rs, seq, payload)
	case rs.have: // a gap
		f.met.gaps.WithLabelValues(rs.r).Inc()
		f.log.Info("kv events gap", "rank", rs.rank, "last", rs.last, "seq", seq)
		from := rs.last + 1
		if f.replayFrom(ctx, rs, from) && rs.last >= seq {
			rs.dupFloor = from - 1
			return // the replay covered this batch too
		}
		if rs.have && rs.last+1 == seq {
			rs.dupFloor = seq
			f.applyBatch(rs, seq, payload)
			return
		}
		f.log.Warn("kv events gap not replayable: clearing the mirror, cold until rebuilt", "rank", rs.rank, "from", from, "seq", seq)
		f.reset(rs, "gap")
		rs.have, rs.last, rs.dupFloor = true, seq, seq
		f.applyBatch(rs, seq, payload)
	default:
		f.baseline(ctx, rs, seq, payload)
	}
}

// baseline starts a rank's stream at seq: from the engine's first batch it is complete; later,
// replay from 0 is tried, and failing that the mirror is built from here on, marked cold.
func (f *Follower) baseline(ctx context.Context, rs *rankState, seq uint64, payload []byte) {
	rs.have, rs.last, rs.dupFloor = false, 0, 0
	if seq == 0 {
		f.setComplete(rs, true)
		rs.have, rs.last, rs.dupFloor = true, 0, 0
		f.applyBatch(rs, seq, payload)
		return
	}
	if f.replayFrom(ctx, rs, 0) && rs.last >= seq {
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
	// Joined late and replay cannot reach the first batch: what the engine cached before is
	// unknown, so estimates are a lower bound until a clean baseline.
	f.met.resyncs.WithLabelValues(rs.r, "start").Inc()
	f.mirror.Clear(rs.rank)
	f.setComplete(rs, false)
	rs.have, rs.last, rs.dupFloor = true, seq, seq
	f.applyBatch(rs, seq, payload)
}

func (f *Follower) setComplete(rs *rankState, ok bool) {
	rs.complete.Store(ok)
	v := 0.0
	if ok {
		v = 1
	}
	f.met.complete.WithLabelValues(rs.r).Set(v)
}

// reset drops the rank's mirror and tells the owner.
func (f *Follower) reset(rs *rankState, cause string) {
	f.met.resyncs.WithLabelValues(rs.r, cause).Inc()
	f.mirror.Clear(rs.rank)
	rs.have, rs.last, rs.dupFloor = false, 0, 0
	f.setComplete(rs, false)
	if f.OnReset != nil {
		f.OnReset(rs.rank, cause)
	}
}

// applyBatch decodes and applies one batch, recording it as the last applied.
func (f *Follower) applyBatch(rs *rankState, seq uint64, payload []byte) {
	rs.have, rs.last = true, seq
	b, err := rs.dec.Decode(seq, payload)
	if err != nil {
		f.met.decodeErrs.WithLabelValues(rs.r).Inc()
		f.log.Debug("kv events decode", "rank", rs.rank, "seq", seq, "err", err)
		return
	}
	for i := range b.Events {
		ev := &b.Events[i]
		f.mirror.Apply(rs.rank, ev)
		f.met.events.WithLabelValues(rs.r, ev.Kind.String()).Inc()
		if ev.Kind == KindCleared {
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
	if b.TS > 0 {
		if lag := time.Since(time.Unix(0, int64(b.TS*1e9))); lag >= 0 {
			f.met.lag.WithLabelValues(rs.r).Observe(lag.Seconds())
		}
	}
}

// errReplayEnd is returned by a replay read at the end marker.
var errReplayEnd = errors.New("replay end")

// replayFrom asks the rank's replay socket for every buffered batch from seq from and applies
// those after rs.last (all of them when the rank has no baseline yet). It returns true when the
// reply started exactly at from (nothing is missing); false when there is no replay socket, the
// exchange failed or timed out, or the engine's buffer no longer reaches back to from.
func (f *Follower) replayFrom(ctx context.Context, rs *rankState, from uint64) bool {
	if rs.replay == "" {
		f.met.replays.WithLabelValues(rs.r, "none").Inc()
		return false
	}
	rctx, cancel := context.WithTimeout(ctx, f.cfg.ReplayTimeout)
	defer cancel()
	first, n, err := Replay(rctx, rs.replay, from, func(seq uint64, payload []byte) error {
		if rs.have && seq <= rs.last {
			return nil
		}
		if !rs.have && seq != from {
			return errShort // the buffer does not reach back: nothing applied
		}
		if rs.have && seq != rs.last+1 {
			return errShort
		}
		f.applyBatch(rs, seq, payload)
		return nil
	})
	switch {
	case errors.Is(err, errShort):
		f.met.replays.WithLabelValues(rs.r, "short").Inc()
		f.log.Info("kv events replay does not reach back", "rank", rs.rank, "from", from, "first", first)
		return false
	case err != nil:
		f.met.replays.WithLabelValues(rs.r, "failed").Inc()
		f.log.Warn("kv events replay failed", "rank", rs.rank, "endpoint", rs.replay, "from", from, "err", err)
		return false
	}
	f.met.replays.WithLabelValues(rs.r, "ok").Inc()
	f.log.Info("kv events replayed", "rank", rs.rank, "from", from, "batches", n)
	return n > 0 && first == from
}

var errShort = errors.New("replay starts after the requested sequence")

// Replay sends one replay request for batches from seq from to the ROUTER at endpoint and calls
// fn for each batch of the reply, in order, until the end marker. It accepts both reply layouts:
// [empty, seq, payload] (vLLM ≤ v0.25, SGLang) and [empty, topic, seq, payload] (vLLM ≥ v0.26).
// It returns the first sequence number received and the number of batches. ctx bounds the
// exchange: an engine that finds the request invalid does not answer at all.
func Replay(ctx context.Context, endpoint string, from uint64, fn func(seq uint64, payload []byte) error) (first uint64, n int, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sock := zmq4.NewDealer(ctx, zmq4.WithDialerMaxRetries(0))
	defer sock.Close()
	if err := sock.Dial(endpoint); err != nil {
		return 0, 0, fmt.Errorf("dial replay %s: %w", endpoint, err)
	}
	var seq8 [8]byte
	putSeq(seq8[:], from)
	if err := sock.SendMulti(zmq4.NewMsgFrom([]byte{}, seq8[:])); err != nil {
		return 0, 0, fmt.Errorf("send replay request: %w", err)
	}
	for {
		msg, err := sock.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return first, n, fmt.Errorf("replay: %w", context.Cause(ctx))
			}
			return first, n, fmt.Errorf("replay receive: %w", err)
		}
		seq, payload, err := parseReplay(msg.Frames)
		if errors.Is(err, errReplayEnd) {
			return first, n, nil
		}
		if err != nil {
			return first, n, err
		}
		if n == 0 {
			first = seq
		}
		n++
		if err := fn(seq, payload); err != nil {
			return first, n, err
		}
	}
}

// EndSeq is the replay end marker's sequence: -1 as a signed 64-bit big-endian integer.
const EndSeq = ^uint64(0)

// parseReplay reads one reply frame set as a DEALER receives it (the ROUTER's identity frame is
// gone, the empty delimiter is first).
func parseReplay(frames [][]byte) (uint64, []byte, error) {
	if len(frames) > 0 && len(frames[0]) == 0 {
		frames = frames[1:]
	}
	switch len(frames) {
	case 2: // [seq, payload]
	case 3: // [topic, seq, payload]
		frames = frames[1:]
	default:
		return 0, nil, fmt.Errorf("%w: replay reply of %d frames", ErrFrames, len(frames))
	}
	seq, err := DecodeSeq(frames[0])
	if err != nil {
		return 0, nil, err
	}
	if seq == EndSeq || len(frames[1]) == 0 {
		return seq, nil, errReplayEnd
	}
	return seq, frames[1], nil
}

func putSeq(b []byte, s uint64) {
	for i := 7; i >= 0; i-- {
		b[i] = byte(s)
		s >>= 8
	}
}
