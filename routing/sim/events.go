package sim

import "time"

// eventKind says what an event does when it fires.
type eventKind uint8

const (
	evArrive        eventKind = iota // a request reaches a router (req)
	evStep                           // node's current step ends (node)
	evKVReady                        // req's KV, loaded from the CPU tier or pulled from its prefill node, is on node
	evDelta                          // a summary delta from node reaches router (msg)
	evRepair                         // router's repair pull of node's full summary completes
	evLoad                           // a load report from node reaches router (msg)
	evLoadTick                       // node checks its load and reports it if it changed
	evShareDecision                  // another router's decision reaches router (msg)
	evShareLoad                      // another router's load report reaches router (msg)
	evShareTick                      // router checks its own load and reports it if it changed
	evShareTTFT                      // another router's first-token observations reach router (msg)
	evDecide                         // a request's router decides after its admission delay (req)
)

// event is one scheduled happening. Events are ordered by (at, seq): seq is the scheduling
// order, so simultaneous events fire in the order they were scheduled and a run is a pure
// function of its inputs.
type event struct {
	at     time.Duration
	seq    uint64
	kind   eventKind
	node   int
	router int
	req    int
	msg    int // index into the simulator's message table (deltas, load reports, shares)
}

func (a *event) before(b *event) bool {
	if a.at != b.at {
		return a.at < b.at
	}
	return a.seq < b.seq
}

// eventQueue is a binary min-heap of events on a virtual clock.
type eventQueue struct {
	h   []event
	seq uint64
	now time.Duration
}

// schedule adds e to fire at e.at (never before now).
func (q *eventQueue) schedule(e event) {
	e.at = max(e.at, q.now)
	q.seq++
	e.seq = q.seq
	q.h = append(q.h, e)
	for i := len(q.h) - 1; i > 0; {
		p := (i - 1) / 2
		if !q.h[i].before(&q.h[p]) {
			break
		}
		q.h[i], q.h[p] = q.h[p], q.h[i]
		i = p
	}
}

// next removes the earliest event and advances the clock to it.
func (q *eventQueue) next() (event, bool) {
	if len(q.h) == 0 {
		return event{}, false
	}
	e := q.h[0]
	last := len(q.h) - 1
	q.h[0] = q.h[last]
	q.h = q.h[:last]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < last && q.h[l].before(&q.h[m]) {
			m = l
		}
		if r < last && q.h[r].before(&q.h[m]) {
			m = r
		}
		if m == i {
			break
		}
		q.h[i], q.h[m] = q.h[m], q.h[i]
		i = m
	}
	q.now = e.at
	return e, true
}

func (q *eventQueue) len() int { return len(q.h) }
