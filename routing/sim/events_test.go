package sim

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestEventQueueOrder checks the heap against a sorted reference: events come out by time, and
// events at the same time in the order they were scheduled.
func TestEventQueueOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var q eventQueue
	var want []event
	for i := 0; i < 2000; i++ {
		// Few distinct offsets from now, so many ties; never in the past, as in the simulator.
		e := event{at: q.now + time.Duration(rng.IntN(20))*time.Millisecond, req: i}
		q.schedule(e)
		e.seq = uint64(i + 1)
		want = append(want, e)
		if rng.IntN(3) == 0 { // interleave pops with pushes, as the simulator does
			got, ok := q.next()
			if !ok {
				t.Fatal("queue empty")
			}
			slices.SortStableFunc(want, func(a, b event) int { return int(a.at - b.at) })
			if got.req != want[0].req || got.at != want[0].at {
				t.Fatalf("popped req %d at %v, want req %d at %v", got.req, got.at, want[0].req, want[0].at)
			}
			want = want[1:]
		}
	}
	slices.SortStableFunc(want, func(a, b event) int { return int(a.at - b.at) })
	for len(want) > 0 {
		got, _ := q.next()
		if got.req != want[0].req {
			t.Fatalf("popped req %d, want %d", got.req, want[0].req)
		}
		want = want[1:]
	}
	if _, ok := q.next(); ok || q.len() != 0 {
		t.Fatal("queue not empty at the end")
	}
}

func TestEventQueueClock(t *testing.T) {
	var q eventQueue
	q.schedule(event{at: 5 * time.Second, req: 1})
	e, _ := q.next()
	if q.now != 5*time.Second || e.req != 1 {
		t.Fatalf("clock %v after popping req %d", q.now, e.req)
	}
	// Scheduling in the past clamps to now: the virtual clock never runs backwards.
	q.schedule(event{at: time.Second, req: 2})
	q.schedule(event{at: 5 * time.Second, req: 3})
	e, _ = q.next()
	if e.at != 5*time.Second || e.req != 2 {
		t.Fatalf("past event fired at %v (req %d), want at now, first", e.at, e.req)
	}
}
