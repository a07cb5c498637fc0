package kvevents

// Replay: asking the engine's ROUTER socket for the batches a rank missed.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/go-zeromq/zmq4"
)

// errReplayEnd is returned by a replay read at the end marker.
var errReplayEnd = errors.New("replay end")

// Replay rounds. The engine's ROUTER drops replies beyond its high-water mark without a word
// (reported for SGLang in sgl-project/sglang#38945), so a long replay can arrive with holes and without its end
// marker: the follower keeps the consecutive part, asks again from there, and treats a reply
// stream that goes quiet for replayQuiet as ended.
const (
	// maxReplayRounds bounds the requests for one gap: each round must make progress, and 64
	// rounds of at least one default ROUTER HWM (1,000 replies) cover vLLM's 10,000-batch buffer
	// several times over.
	maxReplayRounds = 64
	// replayQuiet: 250 ms without a reply ends a round that has received something; the engine
	// sends its buffer back to back, so a pause that long means the rest was dropped.
	replayQuiet = 250 * time.Millisecond
)

var (
	errShort  = errors.New("replay starts after the requested sequence")
	errHole   = errors.New("replay reply has a hole")
	errNoNews = errors.New("replay round made no progress")
	// errRestarted: the reply holds sequence numbers below the requested one.
	errRestarted = errors.New("replay reply from a restarted engine")
)

// startReplay asks the rank's replay socket for every buffered batch from seq from and applies
// those after the last one applied (all of them when the rank has no baseline yet), in rounds
// until the reply is complete; o continues once it ends. accept lets the answer start after
// from (a restored checkpoint's gap, already accepted).
func (m *rankMachine) startReplay(from uint64, o op, accept bool) {
	m.op = o
	if !m.hasReplay {
		m.count(mReplays, "none", 1)
		m.replayDone(replayFailed)
		return
	}
	m.rp = replayRound{from: from, accept: accept}
	m.nextRound()
}

func (m *rankMachine) nextRound() {
	m.rp.want, m.rp.applied = m.rp.from, 0
	if m.have {
		m.rp.want = m.last + 1
	}
	m.io = actReplay
	m.emit(action{kind: actReplay, seq: m.rp.want})
}

// ReplayItem takes one batch of a replay round's answer, in order; a non-nil error ends the
// round (the driver returns it from Replay's callback and hands it to ReplayDone).
func (m *rankMachine) ReplayItem(seq uint64, payload []byte, now time.Time) ([]action, error) {
	m.out, m.now = m.out[:0], now
	want, next := m.rp.want, m.rp.want
	if m.have {
		next = m.last + 1
	}
	switch {
	case seq < want:
		// The ROUTER answers from the requested sequence on: an earlier one comes from a new
		// publisher, i.e. the engine restarted.
		return m.out, errRestarted
	case m.have && seq < next:
		return m.out, nil // already applied
	case seq != next && m.rp.applied == 0 && m.rp.accept && m.acceptGap:
		m.acceptGap = false
		m.log(slog.LevelInfo, "kv events: the engine's replay buffer moved past the checkpoint; the restored mirror goes on from its first batch",
			"after", m.last, "first", seq)
	case seq != next && m.rp.applied == 0 && (m.rp.round == 0 || !m.have):
		return m.out, errShort
	case seq != next:
		return m.out, errHole
	}
	m.applyBatch(seq, payload)
	m.rp.applied++
	return m.out, nil
}

// ReplayDone ends a replay round with what Replay returned: another round, or the operation's
// continuation.
func (m *rankMachine) ReplayDone(first uint64, complete bool, err error, now time.Time) []action {
	m.out, m.now, m.io = m.out[:0], now, 0
	m.rp.total += m.rp.applied
	switch {
	case isErr(err, errRestarted):
		m.count(mReplays, "restarted", 1)
		m.replayDone(replayRestarted)
	case isErr(err, errShort):
		m.count(mReplays, "short", 1)
		m.log(slog.LevelInfo, "kv events replay does not reach back", "from", m.rp.want, "first", first)
		m.replayDone(replayShort)
	case err != nil && !isErr(err, errHole):
		m.count(mReplays, "failed", 1)
		m.log(slog.LevelWarn, "kv events replay failed", "from", m.rp.want, "err", err)
		m.replayDone(replayFailed)
	case err == nil && complete:
		m.count(mReplays, "ok", 1)
		if m.rp.total > 0 {
			m.log(slog.LevelInfo, "kv events replayed", "from", m.rp.from, "batches", m.rp.total, "rounds", m.rp.round+1)
		}
		m.replayDone(replayOK)
	case m.rp.applied == 0:
		m.count(mReplays, "failed", 1)
		m.log(slog.LevelWarn, "kv events replay", "from", m.rp.want, "err", errNoNews)
		m.replayDone(replayFailed)
	case m.rp.round+1 >= maxReplayRounds:
		m.count(mReplays, "failed", 1)
		m.replayDone(replayFailed)
	default: // a hole or a quiet end: ask again from the last batch applied
		m.rp.round++
		m.nextRound()
	}
	return m.end()
}

// replayDone hands a replay's result to the operation that asked for it.
func (m *rankMachine) replayDone(r replayResult) {
	o := m.op
	m.op = op{}
	switch o.kind {
	case opLiveGap:
		m.liveGapDone(o, r)
	case opBaseline:
		m.baselineDone(o, r)
	case opIdleZero:
		m.idleZeroDone(r)
	case opTailGap:
		m.tailGapDone(o, r)
	case opVerifyGap:
		m.verifyGapDone(o, r)
	}
}

func isErr(err, target error) bool { return errors.Is(err, target) }

var (
	// errStop ends a probe after its first batch.
	errStop = errors.New("enough")
	// errOtherEngine: a restored checkpoint's last batch, replayed, has other bytes.
	errOtherEngine = errors.New("the replayed batch differs from the checkpoint's")
)

// Replay sends one replay request for batches from seq from to the ROUTER at endpoint and calls
// fn for each batch of the reply, in order, until the end marker (complete), until the reply
// goes quiet for replayQuiet after at least one batch (not complete: the rest was dropped), or
// until fn returns an error. It accepts both reply layouts: [empty, seq, payload] (vLLM ≤ v0.25,
// SGLang) and [empty, topic, seq, payload] (vLLM ≥ v0.26). It returns the first sequence number
// received and the number of batches. ctx bounds the exchange: an engine that finds the request
// invalid does not answer at all.
func Replay(ctx context.Context, endpoint string, from uint64, fn func(seq uint64, payload []byte) error) (first uint64, n int, complete bool, err error) {
	// The socket lives on its own context so that, when the exchange ends early (fn stops it,
	// ctx ends, the reply goes quiet), its connection can be closed and the library's reader
	// drained before the socket closes (zmtp.go): an abandoned reply leaves nothing behind.
	conns := &connSet{}
	sctx, scancel := context.WithCancel(withConnSet(context.WithoutCancel(ctx), conns))
	sock := zmq4.NewDealer(sctx, zmq4.WithDialerMaxRetries(0))
	// The socket's reader: the only goroutine calling Recv; it hands replies over until the
	// exchange is abandoned, then discards them until the library's last (error) message.
	msgs := make(chan zmq4.Msg, 64)
	readerDone := make(chan struct{})
	abandon := make(chan struct{})
	defer func() {
		close(abandon)
		conns.closeAll()
		select {
		case <-readerDone:
		case <-time.After(drainTimeout):
		}
		scancel()
		_ = sock.Close()
		<-readerDone
	}()
	stopDial := context.AfterFunc(ctx, scancel) // ctx bounds the dial and handshake
	err = sock.Dial(zmqEndpoint(endpoint))
	if !stopDial() {
		err = errors.Join(err, context.Cause(ctx))
	}
	if err != nil {
		close(readerDone)
		return 0, 0, false, fmt.Errorf("dial replay %s: %w", endpoint, err)
	}
	go func() {
		defer close(readerDone)
		defer close(msgs)
		for {
			msg, err := sock.Recv()
			if err != nil {
				return
			}
			select {
			case msgs <- msg:
			case <-abandon: // discard: the exchange is over
			}
		}
	}()
	var seq8 [8]byte
	putSeq(seq8[:], from)
	if err := sock.SendMulti(zmq4.NewMsgFrom([]byte{}, seq8[:])); err != nil {
		return 0, 0, false, fmt.Errorf("send replay request: %w", err)
	}
	quiet := time.NewTimer(time.Hour)
	defer quiet.Stop()
	for {
		var msg zmq4.Msg
		var ok bool
		select {
		case <-ctx.Done():
			return first, n, false, fmt.Errorf("replay: %w", context.Cause(ctx))
		case <-quiet.C:
			return first, n, false, nil
		case msg, ok = <-msgs:
			if !ok {
				return first, n, false, fmt.Errorf("replay receive: socket closed")
			}
		}
		seq, payload, err := parseReplay(msg.Frames)
		if errors.Is(err, errReplayEnd) {
			return first, n, true, nil
		}
		if err != nil {
			return first, n, false, err
		}
		if n == 0 {
			first = seq
		}
		n++
		if err := fn(seq, payload); err != nil {
			return first, n, false, err
		}
		if !quiet.Stop() {
			select {
			case <-quiet.C:
			default:
			}
		}
		quiet.Reset(replayQuiet)
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
