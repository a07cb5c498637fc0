package simengine

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/prefixmesh/prefixmesh/local/kvpool"
)

// Steps: the engine computes as a continuous-batching engine does, one step (one forward pass)
// at a time, timed by the mixed-batch model kvpool.Step and filled as the trace simulator's nodes
// fill theirs (routing/sim, node.go), which is vLLM's scheduler (vllm/v1/core/sched/scheduler.py,
// schedule()):
//
//   - the running sequences first, in admission order: a decoding one takes one token, a
//     prefilling one the rest of its prompt up to what is left of Step.TokenBudget (chunked
//     prefill); a sequence waiting for its KV (a CPU-tier load, a pull) is skipped;
//   - then the queue's head is admitted (admitLocked: lookup, eviction, allocation) while
//     budget and a slot remain and the pool can hold it, its first chunk taking what budget is
//     left; a busy pool blocks the head until blocks free;
//   - the step lasts Step.StepTime of its prefill tokens and decode sequences, so a prompt chunk
//     slows every sequence decoding beside it;
//   - at its end each decoding sequence has one more token, and a sequence whose last chunk ran
//     has its first token and its prompt goes into the cache (prefilledLocked).
//
// One goroutine (stepLoop) runs the steps in the engine's clock, wall time in production. It
// schedules each step to end Step.StepTime after the previous one did while the engine stays
// busy, so a late wake-up shortens the next wait rather than slowing the simulated engine, and
// a step too short for a timer costs no sleep at all. Request handlers never compute: they wait
// for their ticket's tokens (notify) and write them out. Memory is bounded by the slots: one
// batch entry per running sequence.

// clock is the engine's simulated time: the wall clock, or a test's hand-moved one.
type clock interface {
	Now() time.Time
	// SleepUntil waits until t (no wait when t has passed) or until ctx ends, whose error it
	// then returns.
	SleepUntil(ctx context.Context, t time.Time) error
}

// wallClock is real time.
type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

func (wallClock) SleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// scheduled is one sequence's share of a step.
type scheduled struct {
	tk     *ticket
	tokens int
	decode bool
}

// stepLoop runs the engine's steps until ctx ends; Start starts it and Close joins it. It
// sleeps while there is nothing to compute, until kickLocked wakes it.
func (e *Engine) stepLoop(ctx context.Context) {
	defer e.bg.Done()
	var end time.Time // when the last step ended; zero while idle
	for {
		e.mu.Lock()
		d, prefill, ok := e.startStepLocked()
		e.mu.Unlock()
		if !ok {
			end = time.Time{}
			select {
			case <-ctx.Done():
				return
			case <-e.stepKick:
			}
			continue
		}
		if now := e.clk.Now(); end.IsZero() {
			end = now // from idle: the step starts now
		}
		end = end.Add(d)
		if e.clk.SleepUntil(ctx, end) != nil {
			return // closing: the handlers abort and release their tickets
		}
		e.mu.Lock()
		e.endStepLocked(prefill)
		e.mu.Unlock()
	}
}

// kickLocked wakes the step loop if it idles: there may be something to compute or admit. A
// kick while a step runs is seen at the next step. e.mu is held.
func (e *Engine) kickLocked() {
	select {
	case e.stepKick <- struct{}{}:
	default:
	}
}

// startStepLocked fills the next step into e.batch and returns its time and its prefill tokens;
// not ok when there is nothing to compute. e.mu is held.
func (e *Engine) startStepLocked() (d time.Duration, prefill int, ok bool) {
	b := e.step.NewBatch() // the step's budget, shared with the trace simulator (kvpool.Batch)
	e.batch = e.batch[:0]
	for _, tk := range e.seqs {
		if b.Full() {
			break
		}
		switch {
		case tk.waitKV || tk.doneLocked():
		case tk.prefilled:
			b.AddDecode(tk.context)
			e.batch = append(e.batch, scheduled{tk: tk, tokens: 1, decode: true})
		default:
			e.batch = append(e.batch, scheduled{tk: tk, tokens: b.AddPrefill(tk.prefill)})
		}
	}
	for !b.Full() && len(e.queue) > 0 && e.running < e.cfg.MaxConcurrent {
		w := e.queue[0]
		tk, err := e.admitLocked(w.admission)
		if errors.Is(err, kvpool.ErrPoolBusy) {
			if e.blocksWillFreeLocked() {
				break // head-of-line: wait for blocks to free
			}
			err = errExhausted // nothing holds blocks that will free: it can never fit
		}
		e.queue[0] = nil
		e.queue = e.queue[1:]
		e.pendingPrefill -= w.est
		w.tk, w.err = tk, err
		close(w.ready)
		if err != nil || tk.waitKV {
			continue
		}
		e.batch = append(e.batch, scheduled{tk: tk, tokens: b.AddPrefill(tk.prefill)})
	}
	return e.step.Time(&b), b.Prefill, len(e.batch) > 0
}

// endStepLocked applies the step that just ended: a token for each decoding sequence, the
// chunks computed, first tokens and the prompts they complete into the cache; it drops the
// sequences that have all their tokens. A ticket released meanwhile is skipped. e.mu is held.
func (e *Engine) endStepLocked(prefill int) {
	e.met.prefillSeconds.Add(float64(prefill) * e.step.PerPrefillToken)
	finished := false
	for _, b := range e.batch {
		tk := b.tk
		if tk.gone {
			continue
		}
		if b.decode {
			tk.produced++
			tk.context++
		} else {
			tk.prefill -= b.tokens
			tk.context += b.tokens
			e.pendingPrefill -= b.tokens
			if tk.prefill == 0 {
				e.prefilledLocked(tk)
				tk.produced++ // the prefill's forward pass samples the first token
			}
		}
		finished = finished || tk.doneLocked()
		select { // the handler reads produced under e.mu; one pending wake-up is enough
		case tk.notify <- struct{}{}:
		default:
		}
	}
	clear(e.batch) // drop the references: a released ticket's memory goes with its handler
	e.batch = e.batch[:0]
	if finished {
		keep := e.seqs[:0]
		for _, tk := range e.seqs {
			if !tk.doneLocked() {
				keep = append(keep, tk)
			}
		}
		clear(e.seqs[len(keep):])
		e.seqs = keep
	}
}

// prefilledLocked: the prompt is computed, so its blocks go into the cache. e.mu is held.
func (e *Engine) prefilledLocked(tk *ticket) {
	tk.prefilled = true
	if err := tk.seq.Insert(); err != nil {
		e.log.Error("kv pool insert", "err", err) // unreachable: a ticket is inserted once
	}
	e.publishLocked(tk.tokens, tk.adapter)
}

// removeSeqLocked takes tk out of the steps (released or leased). e.mu is held.
func (e *Engine) removeSeqLocked(tk *ticket) {
	tk.gone = true
	if i := slices.Index(e.seqs, tk); i >= 0 {
		e.seqs = slices.Delete(e.seqs, i, i+1) // zeroes the vacated slot
	}
}
