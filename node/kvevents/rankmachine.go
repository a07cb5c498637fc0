package kvevents

// The rank machine: one rank's follower logic as a pure state machine. Its methods take an input
// (a live batch, one batch of a replay answer, the end of a replay round, a probe's answer, an
// idle tick, the engine's restart signal, the start with or without a restored checkpoint) and
// return the actions that follow, in order: what to do to the mirror, which flags and metrics to
// set, what to log, which hooks to call, and at most one exchange with the engine's replay
// socket, always last. It does no IO and reads no clock: the driver (driver.go) owns the sockets
// and timers, executes the actions and feeds the answers back, so every transition can be
// replayed from a script (testdata/follower).

import (
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/cespare/xxhash/v2"
)

// actKind is what an action asks the driver to do.
type actKind uint8

const (
	actApply          actKind = iota + 1 // apply batch.Events[lo:hi] to the mirror, counting each by kind
	actClear                             // drop the rank from the mirror
	actRecordSeq                         // record seq as the rank's position in the mirror (checkpoints pair it)
	actConfirm                           // confirm the rank's restored copies (CacheMirror.ConfirmRestored)
	actSetComplete                       // flag: the rank's completeness (atomic and gauge)
	actSetCold                           // flag: the rank's coldness (atomic and gauge)
	actNotifyComplete                    // call Config.OnComplete(rank, flag)
	actNotifyRestart                     // call Config.OnRestart(rank)
	actCount                             // add n to counter metric{label}
	actLag                               // observe f seconds of lag
	actLog                               // log msg with args at level
	actArmProbe                          // (re)arm the idle probe timer for dur
	actReplay                            // ask the replay socket for every batch from seq (an exchange; last)
	actProbe                             // ask the replay socket from seq and read the first batch only (last)
)

// metricID names a per-rank counter of metrics.
type metricID uint8

const (
	mBatches metricID = iota
	mSkipped
	mFields
	mDecodeErrs
	mGaps
	mReplays
	mResyncs
	mPartial
	mLossy
)

// action is one step the driver executes. Only the fields its kind names are set.
type action struct {
	kind   actKind
	flag   bool
	metric metricID
	label  string
	n      int
	lo, hi int
	seq    uint64
	f      float64
	dur    time.Duration
	batch  *Batch
	pos    RankSeq
	level  slog.Level
	msg    string
	args   []any
}

// replayResult is the outcome of a replay (all its rounds).
type replayResult uint8

const (
	replayOK        replayResult = iota // nothing missing up to the end of the engine's buffer
	replayShort                         // the buffer no longer reaches back: nothing applied
	replayFailed                        // no replay socket, or the exchange failed
	replayRestarted                     // the reply comes from a restarted engine (lower sequences)
)

// opKind is what an outstanding exchange is for: the continuation once it ends.
type opKind uint8

const (
	opNone      opKind = iota
	opLiveGap          // replay for a live batch after a gap (held in op)
	opBaseline         // replay from 0 for a live batch that starts the stream (held in op)
	opIdleZero         // idle, no baseline yet: replay from 0
	opProbeTail        // idle probe from the last batch applied
	opTailGap          // replay after the idle probe, from before + 1
	opVerify           // probe of a restored checkpoint's last batch
	opVerifyGap        // replay of the gap since a verified checkpoint
)

// trigger is the input an operation started from; it decides how the idle timer is re-armed
// once the operation (and any exchange in it) is over.
type trigger uint8

const (
	trigNone  trigger = iota // EngineRestarted: the timer keeps running
	trigLive                 // a batch: back to the base interval
	trigTick                 // the idle probe: back off while probes find nothing
	trigStart                // the start: the base interval
)

// op is the operation waiting for an exchange's answer.
type op struct {
	kind    opKind
	seq     uint64 // the held live batch's sequence (opLiveGap, opBaseline)
	payload []byte // and its payload
	from    uint64 // opLiveGap: the first missing sequence; opTailGap, opVerify*: the last applied before
}

// replayRound is the state of a replay in progress (replayFrom's loop, one round at a time).
type replayRound struct {
	from    uint64 // the first sequence asked for
	want    uint64 // this round's request
	round   int
	applied int // batches applied in this round
	total   int
	// accept: the restored checkpoint's gap is already told (acceptGap), so an answer that
	// starts after want continues the partial mirror from its first batch.
	accept bool
}

// rankMachine is one rank's follower state. Not safe for concurrent use: the rank's applier
// goroutine owns it.
type rankMachine struct {
	rank      int
	hasReplay bool          // the engine serves replay
	base      time.Duration // Config.IdleProbe
	dec       *Decoder

	have     bool   // a batch of the current engine incarnation was applied
	last     uint64 // its sequence number
	dupFloor uint64 // live batches in (dupFloor, last] are duplicates of replayed ones
	complete bool   // exact (see Follower)
	cold     bool   // may hold blocks the engine lost (a restored checkpoint not yet verified)
	// rebuild: the mirror was just cleared as partial (the reason told); the next batch starts
	// it again without another replay from 0.
	rebuild bool
	// restored: the rank starts from a checkpoint (sum is its last batch's xxhash), to be
	// verified before anything else; acceptGap: the gap since could not be replayed, so the
	// next batch after it continues the partial mirror instead of clearing it.
	restored, acceptGap bool
	sum                 uint64

	every time.Duration // the idle probe's current interval
	now   time.Time     // the clock at the current input (lag)
	trig  trigger
	found bool // the idle probe found something to do
	io    actKind
	op    op
	rp    replayRound

	out []action // reused: the actions of the current input
}

func newRankMachine(rank int, hasReplay bool, idleProbe time.Duration) *rankMachine {
	return &rankMachine{rank: rank, hasReplay: hasReplay, base: idleProbe, every: idleProbe, dec: NewDecoder()}
}

// restore starts the rank from a checkpoint's position: cold until start verifies it. It
// returns the flags to set before the follower starts.
func (m *rankMachine) restore(ck RankSeq) []action {
	m.out = m.out[:0]
	m.have, m.last, m.dupFloor, m.sum, m.restored = true, ck.Last, ck.Last, ck.Sum, true
	m.complete, m.cold = ck.Complete, true
	m.emit(action{kind: actSetComplete, flag: ck.Complete})
	m.emit(action{kind: actSetCold, flag: true})
	return m.out
}

// --- inputs ---

// Start is the applier's first input: a restored rank checks what it missed first.
func (m *rankMachine) Start() []action {
	m.begin(trigStart, time.Time{})
	if m.restored {
		m.verifyRestored()
	}
	return m.end()
}

// Live handles one live batch by its sequence number; now is the clock when it was taken.
func (m *rankMachine) Live(seq uint64, payload []byte, now time.Time) []action {
	m.begin(trigLive, now)
	m.live(seq, payload)
	return m.end()
}

// BadMessage counts a live message without a usable sequence (wrong frame count, a sequence
// frame not 8 bytes): dropped; a lost batch then shows as a gap.
func (m *rankMachine) BadMessage() []action {
	m.out = m.out[:0]
	m.count(mDecodeErrs, "", 1)
	return m.out
}

// Tick is the idle probe's timer firing.
func (m *rankMachine) Tick(now time.Time) []action {
	m.begin(trigTick, now)
	// Quiet: batches lost at the tail (or, before the first live batch, everything the engine
	// published before the subscription took) show up only in the replay buffer.
	switch {
	case !m.hasReplay:
	case m.have:
		m.startProbe(m.last, op{kind: opProbeTail, from: m.last})
	default:
		m.startReplay(0, op{kind: opIdleZero}, false)
	}
	return m.end()
}

// EngineRestarted: the engine's process start time changed (node agent's probe).
func (m *rankMachine) EngineRestarted() []action {
	m.begin(trigNone, time.Time{})
	m.log(slog.LevelWarn, "engine restarted: dropping the mirror")
	m.reset("restart", "")
	return m.end()
}

// ProbeItem judges the first batch of a probe's answer: the driver stops the exchange with the
// error returned (errStop, or errOtherEngine when a restored checkpoint's last batch has other
// bytes).
func (m *rankMachine) ProbeItem(seq uint64, payload []byte) error {
	if m.op.kind == opVerify && seq == m.op.from && xxhash.Sum64(payload) != m.sum {
		return errOtherEngine
	}
	return errStop
}

// ProbeDone is a probe's answer as Replay returned it.
func (m *rankMachine) ProbeDone(first uint64, n int, complete bool, err error, now time.Time) []action {
	m.out, m.now, m.io = m.out[:0], now, 0
	o := m.op
	m.op = op{}
	switch o.kind {
	case opProbeTail:
		m.probeTailAnswer(o.from, first, n, complete, err)
	case opVerify:
		m.verifyAnswer(o.from, first, n, complete, err)
	}
	return m.end()
}

// --- transitions ---

func (m *rankMachine) begin(t trigger, now time.Time) {
	m.out, m.trig, m.now, m.found = m.out[:0], t, now, false
}

// end closes an input: unless an exchange is outstanding, the operation is over and the idle
// timer is re-armed as its trigger says.
func (m *rankMachine) end() []action {
	if m.io != 0 {
		return m.out
	}
	switch m.trig {
	case trigLive, trigStart:
		m.every = m.base
		m.emit(action{kind: actArmProbe, dur: m.every})
	case trigTick:
		m.every = nextIdleProbe(m.every, m.base, m.found)
		m.emit(action{kind: actArmProbe, dur: m.every})
	}
	m.trig = trigNone
	return m.out
}

func (m *rankMachine) live(seq uint64, payload []byte) {
	switch {
	case m.have && seq == m.last+1:
		m.dupFloor = seq
		m.applyBatch(seq, payload)
	case m.have && seq <= m.last && seq > m.dupFloor:
		// Queued while a replay delivered it: a duplicate.
	case m.have && seq <= m.last:
		m.log(slog.LevelWarn, "kv events sequence went back: engine restarted; dropping the mirror", "last", m.last, "seq", seq)
		m.reset("restart", "")
		m.baseline(seq, payload)
	case m.have: // a gap
		m.count(mGaps, "", 1)
		m.log(slog.LevelInfo, "kv events gap", "last", m.last, "seq", seq)
		m.startReplay(m.last+1, op{kind: opLiveGap, seq: seq, payload: payload, from: m.last + 1}, false)
	default:
		m.baseline(seq, payload)
	}
}

// liveGapDone continues a live batch after a gap once its replay ended.
func (m *rankMachine) liveGapDone(o op, r replayResult) {
	seq, payload, from := o.seq, o.payload, o.from
	switch {
	case r == replayOK && m.last >= seq:
		m.dupFloor = from - 1 // the replay covered this batch too
	case r == replayRestarted:
		// The answer holds sequences below the one asked for: a new engine process answered,
		// so the gap is a restart, not a loss. As when a live sequence goes back: a new epoch,
		// and the mirror rebuilt from the new engine's batches (replayed from 0 when they reach).
		m.log(slog.LevelWarn, "kv events replay shows the engine restarted during a gap; dropping the mirror", "last", m.last, "seq", seq)
		m.reset("restart", "")
		m.baseline(seq, payload)
	case m.have && m.last+1 == seq:
		m.dupFloor = seq
		m.applyBatch(seq, payload)
	case m.acceptGap: // the checkpoint's gap, already told: continue the partial mirror
		m.acceptGap = false
		m.dupFloor = seq
		m.applyBatch(seq, payload)
	default:
		m.reset("gap", "batches "+strconv.FormatUint(from, 10)+" to "+strconv.FormatUint(seq-1, 10)+" were lost and could not be replayed")
		m.have, m.last, m.dupFloor = true, seq, seq
		m.applyBatch(seq, payload)
	}
}

// baseline starts a rank's stream at seq: from the engine's first batch it is complete; later,
// replay from 0 is tried, and failing that the mirror is built from here on, partial (a lower
// bound). Right after a partial reset (rebuild) the reason is already told and replay from 0 is
// not tried again.
func (m *rankMachine) baseline(seq uint64, payload []byte) {
	rebuild := m.rebuild
	m.rebuild = false
	m.have, m.last, m.dupFloor = false, 0, 0
	if seq == 0 {
		m.setComplete(true)
		m.have, m.last, m.dupFloor = true, 0, 0
		m.applyBatch(seq, payload)
		return
	}
	if !rebuild {
		m.startReplay(0, op{kind: opBaseline, seq: seq, payload: payload}, false)
		return
	}
	m.have, m.last, m.dupFloor = true, seq, seq
	m.applyBatch(seq, payload)
}

func (m *rankMachine) baselineDone(o op, r replayResult) {
	seq, payload := o.seq, o.payload
	if r == replayOK && m.last >= seq {
		m.setComplete(true)
		m.dupFloor = 0
		return
	}
	if m.have && m.last+1 == seq {
		m.setComplete(true)
		m.dupFloor = seq
		m.applyBatch(seq, payload)
		return
	}
	// Joined late and replay cannot reach the first batch: what the engine cached before is
	// unknown, but every block reported from here on is real, so estimates are a lower bound
	// until a clean baseline.
	m.emit(action{kind: actClear})
	why := "its first batch has sequence " + strconv.FormatUint(seq, 10) +
		" (the agent started after the engine published, or the publisher counts from 1)"
	if !m.hasReplay {
		why += " and there is no replay socket"
	} else {
		why += " and replay does not reach back to sequence 0"
	}
	m.partial("late_join", why)
	m.count(mResyncs, "start", 1) // counted once the rank reads incomplete
	m.have, m.last, m.dupFloor = true, seq, seq
	m.applyBatch(seq, payload)
}

// probeTailAnswer checks a quiet rank against the engine's replay buffer, asked from the last
// batch applied: the buffer only ever drops its oldest batches, so an empty answer means the
// engine's sequence started over below it (a restart whose first batches were lost), and a first
// batch after it means the buffer moved past it. Otherwise whatever came after the last batch
// (published and lost at the tail) is replayed; live duplicates are dropped.
func (m *rankMachine) probeTailAnswer(before, first uint64, n int, complete bool, err error) {
	switch {
	case err == nil && complete && n == 0:
		m.log(slog.LevelWarn, "kv events: the engine's replay buffer no longer holds the last batch applied: it restarted; dropping the mirror", "last", before)
		m.reset("restart", "")
		m.found = true
	case isErr(err, errStop) && first > before && m.acceptGap:
		// A restored checkpoint whose gap is already accepted (told partial, credited): the
		// buffer having moved past it is what made it partial, not news. The quiet engine is
		// no reason to drop it; whatever the buffer still holds continues it.
		m.startReplay(before+1, op{kind: opTailGap, from: before}, true)
	case isErr(err, errStop) && first > before:
		m.reset("gap", "batches after sequence "+strconv.FormatUint(before, 10)+" were lost and the replay buffer no longer holds them")
		m.found = true
	case !isErr(err, errStop):
		m.log(slog.LevelDebug, "kv events idle probe", "err", err)
	default:
		m.startReplay(before+1, op{kind: opTailGap, from: before}, false)
	}
}

func (m *rankMachine) tailGapDone(o op, r replayResult) {
	before := o.from
	switch r {
	case replayOK:
		if m.last > before {
			m.count(mGaps, "", 1)
			m.dupFloor = before
			m.log(slog.LevelInfo, "kv events: replayed batches lost at the tail", "after", before, "batches", m.last-before)
			m.found = true
		}
	case replayShort:
		m.reset("gap", "batches after sequence "+strconv.FormatUint(before, 10)+" were lost and the replay buffer no longer holds them")
		m.found = true
	case replayRestarted:
		m.log(slog.LevelWarn, "kv events: the engine restarted (its replay buffer starts over); dropping the mirror")
		m.reset("restart", "")
		m.found = true
	case replayFailed: // logged; the next live batch or probe tries again
	}
}

func (m *rankMachine) idleZeroDone(r replayResult) {
	if r == replayOK {
		// The buffer reaches back to seq 0, or is empty because the engine has published
		// nothing yet (its buffer only ever drops its oldest batches): a clean baseline.
		m.found = m.have || !m.complete
		m.setComplete(true)
	}
}

// lossy handles a batch that did not decode whole (see applyBatch): a gap, counted, then a
// partial rebuild that continues with the next batch.
func (m *rankMachine) lossy(seq uint64, what string) {
	m.count(mGaps, "", 1)
	m.count(mLossy, "", 1)
	m.emit(action{kind: actClear})
	m.partial("decode", "batch "+strconv.FormatUint(seq, 10)+" was not applied whole ("+what+")")
	m.count(mResyncs, "decode", 1)
}

// partial marks the rank partial: a lower bound of the engine's cache, credited, never cold.
func (m *rankMachine) partial(reason, why string) {
	m.log(slog.LevelWarn, "kv events mirror partial because "+why+": its estimates are a lower bound until the engine clears its cache or restarts",
		"reason", reason)
	m.count(mPartial, reason, 1)
	m.setComplete(false)
	m.setCold(false)
}

// setCold records whether the rank's mirror may hold blocks the engine lost; OnComplete is told
// of a change (the node agent gossips Cold).
func (m *rankMachine) setCold(cold bool) {
	was := m.cold
	m.cold = cold
	m.emit(action{kind: actSetCold, flag: cold})
	if was != cold {
		m.emit(action{kind: actNotifyComplete, flag: m.complete})
	}
}

func (m *rankMachine) setComplete(ok bool) {
	if ok {
		m.setCold(false)
	}
	was := m.complete
	m.complete = ok
	m.emit(action{kind: actSetComplete, flag: ok})
	if was != ok {
		m.emit(action{kind: actNotifyComplete, flag: ok})
	}
}

// reset drops the rank's mirror; its removals reach routers through the summary journal. After
// an engine restart (cause "restart", why "") OnRestart is told, once the mirror is clear, and
// the next batch is a new baseline. Any other cause says why the mirror may have missed
// removals: the rank is rebuilt from the next batch on, partial.
func (m *rankMachine) reset(cause, why string) {
	m.emit(action{kind: actClear})
	m.emit(action{kind: actRecordSeq})
	m.have, m.last, m.dupFloor, m.acceptGap = false, 0, 0, false
	if why != "" {
		m.partial(cause, why)
		m.rebuild = true
	} else {
		m.setComplete(false)
		m.setCold(false)
		m.rebuild = false
	}
	// Counted after the rank reads incomplete, so whoever sees the resync sees it partial too.
	m.count(mResyncs, cause, 1)
	if cause == "restart" {
		m.emit(action{kind: actNotifyRestart})
	}
}

// applyBatch decodes and applies one batch, recording it as the last applied. A batch that does
// not decode whole may have removed blocks the mirror still holds: a decode error, a malformed
// event, or an event of an unknown kind that may remove (Batch.UnknownRemoving: it names blocks,
// or has no readable tag). That is a gap that no replay can fill (the engine's buffer holds the
// same bytes), so the rank is cleared and rebuilt from here on, partial, keeping what did decode
// in this batch. An unknown event that names no blocks cannot take one away: it is counted and
// skipped, and the batch applies whole.
func (m *rankMachine) applyBatch(seq uint64, payload []byte) {
	m.have, m.last = true, seq
	b, err := m.dec.Decode(seq, payload)
	if err != nil {
		m.count(mDecodeErrs, "", 1)
		m.log(slog.LevelDebug, "kv events decode", "seq", seq, "err", err)
		m.lossy(seq, "it could not be decoded: "+err.Error())
		return
	}
	whole := b.Malformed == 0 && b.UnknownRemoving == 0
	if !whole {
		m.lossy(seq, fmt.Sprintf("it held %d malformed events and %d unknown events that may remove blocks", b.Malformed, b.UnknownRemoving))
	}
	lo := 0
	if whole {
		// AllBlocksCleared: the engine's cache is empty, the mirror is exact again from there.
		for i := range b.Events {
			if b.Events[i].Kind == KindCleared {
				m.emit(action{kind: actApply, batch: b, lo: 0, hi: i + 1})
				m.setComplete(true)
				lo = i + 1
				break
			}
		}
	}
	if lo < len(b.Events) {
		m.emit(action{kind: actApply, batch: b, lo: lo, hi: len(b.Events)})
	}
	if n := b.Unknown - b.UnknownRemoving; n > 0 {
		m.count(mSkipped, "unknown_tag", n)
	}
	if b.UnknownRemoving > 0 {
		m.count(mSkipped, "unknown_removing", b.UnknownRemoving)
	}
	if b.Malformed > 0 {
		m.count(mSkipped, "malformed", b.Malformed)
	}
	if b.Fields > 0 {
		m.count(mFields, "", b.Fields)
	}
	m.count(mBatches, "", 1)
	m.emit(action{kind: actRecordSeq, pos: RankSeq{Have: true, Last: seq, Sum: xxhash.Sum64(payload), Complete: m.complete}})
	if b.TS > 0 && !m.now.IsZero() {
		if lag := m.now.Sub(time.Unix(0, int64(b.TS*1e9))); lag >= 0 {
			m.emit(action{kind: actLag, f: lag.Seconds()})
		}
	}
}

// --- helpers ---

func (m *rankMachine) emit(a action) { m.out = append(m.out, a) }

func (m *rankMachine) count(id metricID, label string, n int) {
	m.emit(action{kind: actCount, metric: id, label: label, n: n})
}

func (m *rankMachine) log(level slog.Level, msg string, args ...any) {
	m.emit(action{kind: actLog, level: level, msg: msg, args: args})
}

func (m *rankMachine) startProbe(from uint64, o op) {
	m.op, m.io = o, actProbe
	m.emit(action{kind: actProbe, seq: from})
}

// nextIdleProbe is the idle probe's next interval: back to base after a probe that found
// something, else doubled up to maxIdleProbe (or base, when that is longer).
func nextIdleProbe(every, base time.Duration, found bool) time.Duration {
	if found {
		return base
	}
	return min(2*every, max(base, maxIdleProbe))
}

// maxIdleProbe caps the idle probe's back-off: a quiet engine's replay socket is asked at least
// every 32 s, so a batch lost at the tail of a burst is found within that.
const maxIdleProbe = 32 * time.Second
