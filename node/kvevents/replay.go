package kvevents

// Replay: asking the engine's ROUTER socket for the batches a rank missed.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-zeromq/zmq4"
)

// errReplayEnd is returned by a replay read at the end marker.
var errReplayEnd = errors.New("replay end")

// Replay rounds. The engine's ROUTER drops replies beyond its high-water mark without a word
// (reported for SGLang, SG-38945), so a long replay can arrive with holes and without its end
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

// replayFrom asks the rank's replay socket for every buffered batch from seq from and applies
// those after rs.last (all of them when the rank has no baseline yet), in rounds until the
// reply is complete.
func (f *Follower) replayFrom(ctx context.Context, rs *rankState, from uint64) replayResult {
	if rs.replay == "" {
		f.met.replays.WithLabelValues(rs.r, "none").Inc()
		return replayFailed
	}
	total := 0
	for round := 0; round < maxReplayRounds; round++ {
		want := from
		if rs.have {
			want = rs.last + 1
		}
		applied := 0
		rctx, cancel := context.WithTimeout(ctx, f.cfg.ReplayTimeout)
		first, _, complete, err := Replay(rctx, rs.replay, want, func(seq uint64, payload []byte) error {
			next := want
			if rs.have {
				next = rs.last + 1
			}
			switch {
			case seq < want:
				// The ROUTER answers from the requested sequence on: an earlier one comes from
				// a new publisher, i.e. the engine restarted.
				return errRestarted
			case rs.have && seq < next:
				return nil // already applied
			case seq != next && applied == 0 && (round == 0 || !rs.have):
				return errShort
			case seq != next:
				return errHole
			}
			f.applyBatch(rs, seq, payload)
			applied++
			return nil
		})
		cancel()
		total += applied
		switch {
		case errors.Is(err, errRestarted):
			f.met.replays.WithLabelValues(rs.r, "restarted").Inc()
			return replayRestarted
		case errors.Is(err, errShort):
			f.met.replays.WithLabelValues(rs.r, "short").Inc()
			f.log.Info("kv events replay does not reach back", "rank", rs.rank, "from", want, "first", first)
			return replayShort
		case err != nil && !errors.Is(err, errHole):
			f.met.replays.WithLabelValues(rs.r, "failed").Inc()
			f.log.Warn("kv events replay failed", "rank", rs.rank, "endpoint", rs.replay, "from", want, "err", err)
			return replayFailed
		case err == nil && complete:
			f.met.replays.WithLabelValues(rs.r, "ok").Inc()
			if total > 0 {
				f.log.Info("kv events replayed", "rank", rs.rank, "from", from, "batches", total, "rounds", round+1)
			}
			return replayOK
		case applied == 0:
			f.met.replays.WithLabelValues(rs.r, "failed").Inc()
			f.log.Warn("kv events replay", "rank", rs.rank, "from", want, "err", errNoNews)
			return replayFailed
		}
		// A hole or a quiet end: ask again from the last batch applied.
	}
	f.met.replays.WithLabelValues(rs.r, "failed").Inc()
	return replayFailed
}

// replayResult is the outcome of replayFrom.
type replayResult uint8

const (
	replayOK        replayResult = iota // nothing missing up to the end of the engine's buffer
	replayShort                         // the buffer no longer reaches back: nothing applied
	replayFailed                        // no replay socket, or the exchange failed
	replayRestarted                     // the reply comes from a restarted engine (lower sequences)
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
