package flow

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// refQueue is the naive reference the model-based test compares Queue with: slices scanned in
// full, the rules written as plainly as they read in Queue's documentation.
type refQueue struct {
	lim    Limits
	items  [NumClasses][]refItem // arrival order
	ring   [NumClasses][]string  // tenants with items, in serving order
	cursor [NumClasses]int
	seq    uint64
}

type refItem struct {
	id     int
	tenant string
	enq    time.Time
	seq    uint64
}

func (r *refQueue) len() int {
	n := 0
	for c := range r.items {
		n += len(r.items[c])
	}
	return n
}

func (r *refQueue) count(c int, tenant string) int {
	n := 0
	for _, it := range r.items[c] {
		if it.tenant == tenant {
			n++
		}
	}
	return n
}

// removeAt removes items[c][i], and its tenant from the ring when it was the tenant's last.
func (r *refQueue) removeAt(c, i int) refItem {
	it := r.items[c][i]
	r.items[c] = slices.Delete(r.items[c], i, i+1)
	if r.count(c, it.tenant) == 0 {
		k := slices.Index(r.ring[c], it.tenant)
		r.ring[c] = slices.Delete(r.ring[c], k, k+1)
		if k < r.cursor[c] {
			r.cursor[c]--
		}
		if r.cursor[c] >= len(r.ring[c]) {
			r.cursor[c] = 0
		}
	}
	return it
}

func (r *refQueue) insert(c int, it refItem) {
	r.seq++
	it.seq = r.seq
	if r.count(c, it.tenant) == 0 {
		r.ring[c] = slices.Insert(r.ring[c], r.cursor[c], it.tenant)
		if len(r.ring[c]) > 1 {
			r.cursor[c]++
		}
	}
	r.items[c] = append(r.items[c], it)
}

// push returns the id shed (-1: none) and why.
func (r *refQueue) push(c int, it refItem) (int, Reason) {
	if len(r.items[c]) >= r.lim.MaxQueued[c] {
		return it.id, ReasonQueueFull
	}
	shed, why := -1, Reason("")
	if r.len() >= r.lim.MaxTotal {
		l := NumClasses - 1
		for l > c && len(r.items[l]) == 0 {
			l--
		}
		if l == c {
			return it.id, ReasonQueueFull
		}
		// The tenant with the most items, ties to the one whose newest arrived last; its newest.
		best, bestN, bestSeq, bestIdx := "", -1, uint64(0), -1
		for i, x := range r.items[l] {
			n := r.count(l, x.tenant)
			// x.seq grows along the slice, so the last item seen of a tenant is its newest.
			if n > bestN || n == bestN && x.seq > bestSeq || x.tenant == best {
				best, bestN, bestSeq, bestIdx = x.tenant, n, x.seq, i
			}
		}
		shed, why = r.removeAt(l, bestIdx).id, ReasonDisplaced
	}
	r.insert(c, it)
	return shed, why
}

func (r *refQueue) pop() (int, bool) {
	for c := range r.items {
		if len(r.items[c]) == 0 {
			continue
		}
		t := r.ring[c][r.cursor[c]]
		i := slices.IndexFunc(r.items[c], func(x refItem) bool { return x.tenant == t })
		before := len(r.ring[c])
		it := r.removeAt(c, i)
		if len(r.ring[c]) == before { // t still has items: its turn passes to the next tenant
			r.cursor[c] = (r.cursor[c] + 1) % len(r.ring[c])
		}
		return it.id, true
	}
	return -1, false
}

func (r *refQueue) expire(now time.Time) []int {
	var out []int
	for c := range r.items {
		for len(r.items[c]) > 0 && !now.Before(r.items[c][0].enq.Add(r.lim.MaxWait[c])) {
			out = append(out, r.removeAt(c, 0).id)
		}
	}
	return out
}

func (r *refQueue) remove(id int) bool {
	for c := range r.items {
		for i, x := range r.items[c] {
			if x.id == id {
				r.removeAt(c, i)
				return true
			}
		}
	}
	return false
}

// checkInvariants checks Queue's internal structure: counts agree, lists are consistent, every
// tenant in the map is in the ring and has items, bounds hold.
func checkInvariants(t *testing.T, q *Queue[int]) {
	t.Helper()
	total := 0
	for c := range q.cls {
		cq := &q.cls[c]
		n := 0
		var prev *Item[int]
		perTenant := map[string]int{}
		for it := cq.head; it != nil; it = it.nextA {
			if it.prevA != prev || !it.queued || it.Class != Class(c) || it.t == nil || it.t.key != it.Tenant {
				t.Fatalf("class %d: arrival list broken at item %d", c, it.Value)
			}
			if prev != nil && prev.seq >= it.seq {
				t.Fatalf("class %d: arrival order broken", c)
			}
			perTenant[it.Tenant]++
			prev = it
			n++
		}
		if prev != cq.tail || n != cq.n {
			t.Fatalf("class %d: tail or count wrong (%d items, n=%d)", c, n, cq.n)
		}
		if n > q.lim.MaxQueued[c] {
			t.Fatalf("class %d: %d items over its bound %d", c, n, q.lim.MaxQueued[c])
		}
		if len(cq.tenants) != len(perTenant) {
			t.Fatalf("class %d: %d tenants in the map, %d with items", c, len(cq.tenants), len(perTenant))
		}
		for k, tn := range cq.tenants {
			m := 0
			for it := tn.head; it != nil; it = it.nextT {
				m++
			}
			if m != tn.n || tn.n != perTenant[k] || tn.n == 0 {
				t.Fatalf("class %d tenant %q: FIFO holds %d, n=%d, arrival list has %d", c, k, m, tn.n, perTenant[k])
			}
		}
		if (cq.cursor == nil) != (n == 0) {
			t.Fatalf("class %d: cursor %v with %d items", c, cq.cursor, n)
		}
		if cq.cursor != nil {
			ring := 0
			for tn := cq.cursor; ; tn = tn.next {
				if cq.tenants[tn.key] != tn || tn.next.prev != tn {
					t.Fatalf("class %d: ring broken at %q", c, tn.key)
				}
				ring++
				if tn.next == cq.cursor {
					break
				}
				if ring > len(cq.tenants) {
					t.Fatalf("class %d: ring longer than its tenants", c)
				}
			}
			if ring != len(cq.tenants) {
				t.Fatalf("class %d: ring of %d, %d tenants", c, ring, len(cq.tenants))
			}
		}
		total += n
	}
	if total != q.n || total > q.lim.MaxTotal {
		t.Fatalf("total %d, n=%d, bound %d", total, q.n, q.lim.MaxTotal)
	}
}

// TestQueueAgainstReference drives Queue and the reference with the same random operations
// (push, pop, expire at an advancing clock, cancel) and requires the same answers after each,
// with Queue's invariants checked throughout.
func TestQueueAgainstReference(t *testing.T) {
	for seed := range uint64(300) {
		rng := rand.New(rand.NewPCG(seed, 0x5eed))
		lim := Limits{MaxTotal: 1 + rng.IntN(12)}
		for c := range NumClasses {
			lim.MaxQueued[c] = rng.IntN(10)
			lim.MaxWait[c] = time.Duration(1+rng.IntN(50)) * time.Millisecond
		}
		q, err := NewQueue[int](lim)
		if err != nil {
			t.Fatal(err)
		}
		ref := &refQueue{lim: lim}
		items := map[int]*Item[int]{}
		now := time.Unix(1000, 0)
		tenants := 1 + rng.IntN(5)
		for step := range 400 {
			switch op := rng.IntN(10); {
			case op < 5: // push
				c := rng.IntN(NumClasses)
				tn := fmt.Sprintf("t%d", rng.IntN(tenants))
				it := &Item[int]{Value: step, Class: Class(c), Tenant: tn, Enqueued: now}
				items[step] = it
				shed, why := q.Push(it)
				rid, rwhy := ref.push(c, refItem{id: step, tenant: tn, enq: now})
				got := -1
				if shed != nil {
					got = shed.Value
				}
				if got != rid || why != rwhy {
					t.Fatalf("seed %d step %d: push(%d, %s): shed %d %q, reference %d %q", seed, step, c, tn, got, why, rid, rwhy)
				}
			case op < 7: // pop
				it := q.Pop()
				rid, ok := ref.pop()
				if (it != nil) != ok || it != nil && it.Value != rid {
					t.Fatalf("seed %d step %d: pop %v, reference %d %v", seed, step, it, rid, ok)
				}
			case op < 9: // time passes, expire
				now = now.Add(time.Duration(rng.IntN(20)) * time.Millisecond)
				var got []int
				q.Expire(now, func(it *Item[int]) { got = append(got, it.Value) })
				if want := ref.expire(now); !slices.Equal(got, want) {
					t.Fatalf("seed %d step %d: expired %v, reference %v", seed, step, got, want)
				}
				if d, ok := q.NextDeadline(); ok && !d.After(now) {
					t.Fatalf("seed %d step %d: next deadline %v not after now after Expire", seed, step, d)
				}
			default: // cancel a random earlier request
				id := rng.IntN(step + 1)
				if it, ok := items[id]; ok {
					if got, want := q.Remove(it), ref.remove(id); got != want {
						t.Fatalf("seed %d step %d: remove %d: %v, reference %v", seed, step, id, got, want)
					}
				}
			}
			checkInvariants(t, q)
			if q.Len() != ref.len() {
				t.Fatalf("seed %d step %d: len %d, reference %d", seed, step, q.Len(), ref.len())
			}
		}
	}
}

func newTestQueue(t *testing.T, perClass, total int) *Queue[string] {
	t.Helper()
	lim := Limits{MaxTotal: total}
	for c := range NumClasses {
		lim.MaxQueued[c] = perClass
		lim.MaxWait[c] = time.Second
	}
	q, err := NewQueue[string](lim)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func TestQueueRules(t *testing.T) {
	t0 := time.Unix(0, 0)
	type push struct {
		class  Class
		tenant string
		name   string
	}
	for _, tc := range []struct {
		name     string
		perClass int
		total    int
		pushes   []push
		shed     []string // "name:reason", in push order
		order    []string // what Pop returns, to empty
	}{
		{
			name: "strict priority between classes", perClass: 10, total: 10,
			pushes: []push{{Sheddable, "a", "s1"}, {Standard, "a", "n1"}, {Critical, "a", "c1"}, {Standard, "a", "n2"}},
			order:  []string{"c1", "n1", "n2", "s1"},
		},
		{
			name: "round robin between tenants, FCFS within one", perClass: 10, total: 10,
			pushes: []push{{Standard, "flood", "f1"}, {Standard, "flood", "f2"}, {Standard, "flood", "f3"}, {Standard, "quiet", "q1"}, {Standard, "quiet", "q2"}},
			order:  []string{"f1", "q1", "f2", "q2", "f3"},
		},
		{
			name: "a new tenant waits for the round", perClass: 10, total: 10,
			pushes: []push{{Standard, "a", "a1"}, {Standard, "b", "b1"}, {Standard, "a", "a2"}, {Standard, "c", "c1"}},
			order:  []string{"a1", "b1", "c1", "a2"},
		},
		{
			name: "class bound sheds the arrival", perClass: 2, total: 10,
			pushes: []push{{Standard, "a", "n1"}, {Standard, "a", "n2"}, {Standard, "b", "n3"}},
			shed:   []string{"n3:queue-full"},
			order:  []string{"n1", "n2"},
		},
		{
			name: "critical displaces the flooding tenant's newest sheddable", perClass: 5, total: 3,
			pushes: []push{{Sheddable, "quiet", "q1"}, {Sheddable, "flood", "f1"}, {Sheddable, "flood", "f2"}, {Critical, "x", "c1"}},
			shed:   []string{"f2:displaced"},
			order:  []string{"c1", "q1", "f1"},
		},
		{
			name: "lowest class pays first", perClass: 5, total: 2,
			pushes: []push{{Standard, "a", "n1"}, {Sheddable, "a", "s1"}, {Critical, "a", "c1"}, {Critical, "a", "c2"}},
			shed:   []string{"s1:displaced", "n1:displaced"},
			order:  []string{"c1", "c2"},
		},
		{
			name: "nothing below: the arrival is shed", perClass: 5, total: 2,
			pushes: []push{{Critical, "a", "c1"}, {Standard, "a", "n1"}, {Standard, "a", "n2"}, {Sheddable, "a", "s1"}},
			shed:   []string{"n2:queue-full", "s1:queue-full"},
			order:  []string{"c1", "n1"},
		},
		{
			name: "a class with bound 0 never waits", perClass: 0, total: 5,
			pushes: []push{{Standard, "a", "n1"}},
			shed:   []string{"n1:queue-full"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := newTestQueue(t, tc.perClass, tc.total)
			var shed []string
			for _, p := range tc.pushes {
				if s, why := q.Push(&Item[string]{Value: p.name, Class: p.class, Tenant: p.tenant, Enqueued: t0}); s != nil {
					shed = append(shed, s.Value+":"+string(why))
				}
			}
			var order []string
			for it := q.Pop(); it != nil; it = q.Pop() {
				order = append(order, it.Value)
			}
			if !slices.Equal(shed, tc.shed) || !slices.Equal(order, tc.order) {
				t.Fatalf("shed %v order %v; want shed %v order %v", shed, order, tc.shed, tc.order)
			}
		})
	}
}

func TestQueueExpiry(t *testing.T) {
	lim := Limits{MaxTotal: 10, MaxQueued: [NumClasses]int{10, 10, 10},
		MaxWait: [NumClasses]time.Duration{3 * time.Second, 2 * time.Second, time.Second}}
	q, _ := NewQueue[string](lim)
	t0 := time.Unix(0, 0)
	q.Push(&Item[string]{Value: "c", Class: Critical, Enqueued: t0})
	q.Push(&Item[string]{Value: "n", Class: Standard, Enqueued: t0})
	q.Push(&Item[string]{Value: "s", Class: Sheddable, Enqueued: t0})
	q.Push(&Item[string]{Value: "s-late", Class: Sheddable, Enqueued: t0.Add(500 * time.Millisecond)})
	if d, _ := q.NextDeadline(); !d.Equal(t0.Add(time.Second)) {
		t.Fatalf("next deadline %v", d)
	}
	var got []string
	q.Expire(t0.Add(time.Second), func(it *Item[string]) { got = append(got, it.Value) })
	if !slices.Equal(got, []string{"s"}) {
		t.Fatalf("expired %v", got)
	}
	q.Expire(t0.Add(2*time.Second), func(it *Item[string]) { got = append(got, it.Value) })
	if !slices.Equal(got, []string{"s", "n", "s-late"}) {
		t.Fatalf("expired %v", got)
	}
	if d, _ := q.NextDeadline(); !d.Equal(t0.Add(3 * time.Second)) {
		t.Fatalf("next deadline %v", d)
	}
}

func TestLimitsValidate(t *testing.T) {
	bad := []Limits{
		{MaxTotal: -1, MaxWait: [NumClasses]time.Duration{1, 1, 1}},
		{MaxQueued: [NumClasses]int{-1}, MaxWait: [NumClasses]time.Duration{1, 1, 1}},
		{MaxWait: [NumClasses]time.Duration{1, 0, 1}},
	}
	for i, l := range bad {
		if l.Validate() == nil {
			t.Errorf("limits %d validated", i)
		}
	}
}
