package extproc

import "time"

// readerIdle is how long a reader goroutine waits for another stream before it exits.
const readerIdle = 10 * time.Second

// readers runs each stream's reader on a goroutine that has served a stream before, when one is
// idle: a reader's stack grows to the depth of a decision (parse, tokeniser, decider, the
// answer's encoding) several times over from a new goroutine's few KiB, and copying it each
// time cost more than the rest of the stream's bookkeeping. Idle readers wait for a stream for
// readerIdle, then exit, so they are never more than the streams were at once.
type readers struct {
	idle chan func() // unbuffered: a send succeeds only when a reader waits
}

func newReaders() *readers { return &readers{idle: make(chan func())} }

// run runs f on an idle reader, or on a new one.
func (r *readers) run(f func()) {
	select {
	case r.idle <- f:
	default:
		go r.loop(f)
	}
}

func (r *readers) loop(f func()) {
	t := time.NewTimer(readerIdle)
	defer t.Stop()
	for {
		f()
		t.Reset(readerIdle)
		select {
		case f = <-r.idle:
		case <-t.C:
			return
		}
	}
}
