package kvevents

// The rank machine's transitions for a rank restored from a checkpoint (checkpoint.go).

import (
	"fmt"
	"log/slog"
)

// verifyRestored settles a rank restored from a checkpoint before its first live batch. The
// replay socket is asked for the checkpoint's last batch: the same bytes mean the same engine
// incarnation, and the gap since is replayed (exact, or as partial as before, and no longer
// cold); other bytes, or a buffer that starts over, mean the engine restarted (the checkpoint is
// dropped); a buffer that moved past it, no replay socket or no answer leave the restored mirror
// partial with provisional copies (see CacheMirror), credited and no longer cold.
func (m *rankMachine) verifyRestored() {
	m.restored = false
	if !m.hasReplay {
		m.restoredPartial("there is no replay socket to replay what the engine did meanwhile")
		return
	}
	m.startProbe(m.last, op{kind: opVerify, from: m.last})
}

func (m *rankMachine) verifyAnswer(last, first uint64, n int, complete bool, err error) {
	switch {
	case isErr(err, errOtherEngine) || (err == nil && complete && n == 0):
		m.log(slog.LevelWarn, "kv events: the engine restarted while the agent was down: dropping the checkpoint", "last", last)
		m.reset("restart", "")
	case isErr(err, errStop) && first == last:
		m.startReplay(last+1, op{kind: opVerifyGap, from: last}, false)
	case isErr(err, errStop):
		m.restoredPartial("the engine's replay buffer no longer reaches back to the checkpoint")
	default:
		m.restoredPartial("the replay socket did not answer (" + fmt.Sprint(err) + ")")
	}
}

func (m *rankMachine) verifyGapDone(o op, r replayResult) {
	last := o.from
	switch r {
	case replayOK:
		m.dupFloor = last
		m.emit(action{kind: actConfirm})
		m.setCold(false)
		m.log(slog.LevelInfo, "kv events: restored from the checkpoint and replayed the gap", "from", last+1, "batches", m.last-last)
	case replayRestarted:
		m.reset("restart", "")
	default:
		m.restoredPartial("the gap since the checkpoint could not be replayed")
	}
}

// restoredPartial keeps a restored mirror as partial: its provisional copies are credited until
// the engine removes them, and one the engine evicted meanwhile is corrected when it stores the
// block again; the next batch after the gap continues it whatever its sequence.
func (m *rankMachine) restoredPartial(why string) {
	m.acceptGap = true
	m.partial("checkpoint", "it was restored from a checkpoint and "+why)
}
