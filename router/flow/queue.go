package flow

import (
	"fmt"
	"strings"
	"time"
)

// Class is a request's priority class. Lower values are served first; a request of a higher
// class may displace a queued request of a lower one.
type Class uint8

// The classes, from most to least important.
const (
	Critical Class = iota
	Standard
	Sheddable
	// NumClasses is the number of classes; the arrays indexed by Class have this length.
	NumClasses = 3
)

var classNames = [NumClasses]string{"critical", "standard", "sheddable"}

func (c Class) String() string {
	if int(c) < NumClasses {
		return classNames[c]
	}
	return fmt.Sprintf("class(%d)", uint8(c))
}

// ParseClass reads a class name, case-insensitively; false for anything else.
func ParseClass(s string) (Class, bool) {
	for i, n := range classNames {
		if strings.EqualFold(s, n) {
			return Class(i), true
		}
	}
	return Standard, false
}

// Reason is why a request was shed: the value of the X-Prefixmesh-Dropped-Reason header and of
// the shed metric's reason label.
type Reason string

// The reasons a request is shed.
const (
	ReasonQueueFull   Reason = "queue-full"   // its class's queue, or the whole queue, was full on arrival
	ReasonWaitTimeout Reason = "wait-timeout" // it waited its class's MaxWait
	ReasonDisplaced   Reason = "displaced"    // a request of a higher class took its place
)

// Reasons lists every Reason, for metrics created at zero.
var Reasons = [...]Reason{ReasonQueueFull, ReasonWaitTimeout, ReasonDisplaced}

// Limits bound a Queue.
type Limits struct {
	// MaxQueued is each class's bound; 0 makes a class never wait (shed at once when saturated).
	MaxQueued [NumClasses]int
	// MaxTotal bounds all classes together; an arrival beyond it displaces a lower class's
	// request or is shed.
	MaxTotal int
	// MaxWait is each class's longest wait in the queue (> 0).
	MaxWait [NumClasses]time.Duration
}

// Validate reports a bound that cannot work.
func (l *Limits) Validate() error {
	if l.MaxTotal < 0 {
		return fmt.Errorf("flow: MaxTotal %d must not be negative", l.MaxTotal)
	}
	for c := range NumClasses {
		if l.MaxQueued[c] < 0 {
			return fmt.Errorf("flow: MaxQueued[%s] %d must not be negative", Class(c), l.MaxQueued[c])
		}
		if l.MaxWait[c] <= 0 {
			return fmt.Errorf("flow: MaxWait[%s] %v must be positive", Class(c), l.MaxWait[c])
		}
	}
	return nil
}

// Item is one queued request. The caller sets Value, Class, Tenant and Enqueued before Push and
// must not change them while the item is queued.
type Item[T any] struct {
	Value    T
	Class    Class
	Tenant   string
	Enqueued time.Time

	seq          uint64 // arrival order, for ties
	queued       bool
	t            *tenant[T]
	prevA, nextA *Item[T] // the class's arrival order (expiry)
	prevT, nextT *Item[T] // the tenant's FIFO
}

// Queued reports whether the item is in a queue.
func (it *Item[T]) Queued() bool { return it.queued }

type tenant[T any] struct {
	key        string
	n          int
	head, tail *Item[T]
	prev, next *tenant[T] // the class's ring of tenants with queued items
}

type classQueue[T any] struct {
	n          int
	head, tail *Item[T] // arrival order: with one MaxWait per class, also deadline order
	tenants    map[string]*tenant[T]
	cursor     *tenant[T] // the tenant served next
}

// Queue is the pure core of flow control: bounded queues per class, tenants in round robin
// within a class, FCFS within a tenant, strict priority between classes, expiry and
// displacement. It reads no clock (times come in with the items and the calls) and is not safe
// for concurrent use. Memory is bounded by the limits: a tenant exists only while it has items.
type Queue[T any] struct {
	lim Limits
	cls [NumClasses]classQueue[T]
	n   int
	seq uint64
}

// NewQueue returns an empty queue under lim.
func NewQueue[T any](lim Limits) (*Queue[T], error) {
	if err := lim.Validate(); err != nil {
		return nil, err
	}
	q := &Queue[T]{lim: lim}
	for c := range q.cls {
		q.cls[c].tenants = make(map[string]*tenant[T])
	}
	return q, nil
}

// Len is the number of queued items.
func (q *Queue[T]) Len() int { return q.n }

// LenClass is the number of queued items of class c.
func (q *Queue[T]) LenClass(c Class) int { return q.cls[c].n }

// Push queues it, or sheds: it returns the item shed and why, nil when none was. The item shed
// is it itself (its class's queue is full, or the whole queue is and nothing below its class
// can make room) or a displaced item of a lower class (then it is queued). Among the lowest
// class below it that has items, the displaced item is the newest of the tenant with the most
// items (ties: the tenant whose newest item arrived last): the heaviest user of the least
// important class pays, and what it loses is what it has waited least for.
func (q *Queue[T]) Push(it *Item[T]) (shed *Item[T], why Reason) {
	if it.queued {
		panic("flow: Push of a queued item")
	}
	c := it.Class
	if int(c) >= NumClasses {
		c = Sheddable
		it.Class = c
	}
	if q.cls[c].n >= q.lim.MaxQueued[c] {
		return it, ReasonQueueFull
	}
	if q.n >= q.lim.MaxTotal {
		v := q.victim(c)
		if v == nil {
			return it, ReasonQueueFull
		}
		q.Remove(v)
		shed, why = v, ReasonDisplaced
	}
	q.insert(it)
	return shed, why
}

// victim is the item a request of class c would displace, nil when no lower class has items.
func (q *Queue[T]) victim(c Class) *Item[T] {
	for l := NumClasses - 1; l > int(c); l-- {
		cq := &q.cls[l]
		if cq.n == 0 {
			continue
		}
		var best *tenant[T]
		for _, t := range cq.tenants {
			if best == nil || t.n > best.n || t.n == best.n && t.tail.seq > best.tail.seq {
				best = t
			}
		}
		return best.tail
	}
	return nil
}

func (q *Queue[T]) insert(it *Item[T]) {
	cq := &q.cls[it.Class]
	q.seq++
	it.seq, it.queued = q.seq, true
	it.prevA, it.nextA = cq.tail, nil
	if cq.tail != nil {
		cq.tail.nextA = it
	} else {
		cq.head = it
	}
	cq.tail = it
	t := cq.tenants[it.Tenant]
	if t == nil {
		t = &tenant[T]{key: it.Tenant}
		cq.tenants[it.Tenant] = t
		// A new tenant joins the ring just before the cursor: it is served after every tenant
		// already waiting has had its turn in this round.
		if cq.cursor == nil {
			t.prev, t.next = t, t
			cq.cursor = t
		} else {
			t.next, t.prev = cq.cursor, cq.cursor.prev
			t.prev.next, t.next.prev = t, t
		}
	}
	it.t = t
	it.prevT, it.nextT = t.tail, nil
	if t.tail != nil {
		t.tail.nextT = it
	} else {
		t.head = it
	}
	t.tail = it
	t.n++
	cq.n++
	q.n++
}

// Remove takes it out of the queue (a cancelled request); false when it was not queued.
func (q *Queue[T]) Remove(it *Item[T]) bool {
	if !it.queued {
		return false
	}
	cq := &q.cls[it.Class]
	if it.prevA != nil {
		it.prevA.nextA = it.nextA
	} else {
		cq.head = it.nextA
	}
	if it.nextA != nil {
		it.nextA.prevA = it.prevA
	} else {
		cq.tail = it.prevA
	}
	t := it.t
	if it.prevT != nil {
		it.prevT.nextT = it.nextT
	} else {
		t.head = it.nextT
	}
	if it.nextT != nil {
		it.nextT.prevT = it.prevT
	} else {
		t.tail = it.prevT
	}
	t.n--
	if t.n == 0 {
		delete(cq.tenants, t.key)
		if t.next == t {
			cq.cursor = nil
		} else {
			t.prev.next, t.next.prev = t.next, t.prev
			if cq.cursor == t {
				cq.cursor = t.next
			}
		}
		t.prev, t.next = nil, nil
	}
	it.queued, it.t = false, nil
	it.prevA, it.nextA, it.prevT, it.nextT = nil, nil, nil, nil
	cq.n--
	q.n--
	return true
}

// Pop takes the next item to dispatch: from the most important class with items, the oldest
// item of the tenant whose turn it is; nil when the queue is empty.
func (q *Queue[T]) Pop() *Item[T] {
	for c := range q.cls {
		cq := &q.cls[c]
		if cq.n == 0 {
			continue
		}
		t := cq.cursor
		next := t.next
		it := t.head
		q.Remove(it)
		if cq.n > 0 {
			cq.cursor = next // t's turn is over, whether or not it still has items
		}
		return it
	}
	return nil
}

// Expire removes every item that has waited its class's MaxWait by now, oldest first per
// class, and passes each to shed.
func (q *Queue[T]) Expire(now time.Time, shed func(*Item[T])) {
	for c := range q.cls {
		cq := &q.cls[c]
		for cq.head != nil && !now.Before(cq.head.Enqueued.Add(q.lim.MaxWait[c])) {
			it := cq.head
			q.Remove(it)
			shed(it)
		}
	}
}

// NextDeadline is when the next item will have waited its MaxWait; false when nothing is
// queued.
func (q *Queue[T]) NextDeadline() (time.Time, bool) {
	var d time.Time
	ok := false
	for c := range q.cls {
		if h := q.cls[c].head; h != nil {
			if dl := h.Enqueued.Add(q.lim.MaxWait[c]); !ok || dl.Before(d) {
				d, ok = dl, true
			}
		}
	}
	return d, ok
}
