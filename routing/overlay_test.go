package routing

import (
	"fmt"
	"testing"
	"time"
)

func TestOverlayRecordEstimateExpire(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	o := NewOverlay(4*time.Second, 1000)
	chain := []uint64{1, 2, 3, 4, 5}
	o.Record("a", chain[:3], t0)
	o.Record("b", chain, t0.Add(time.Second))
	nodes := []string{"a", "b", "c"}
	got := []int{0, 0, 0}
	o.Estimate(chain, nodes, got, t0.Add(time.Second))
	if fmt.Sprint(got) != "[3 5 0]" {
		t.Fatalf("estimate %v", got)
	}
	// Never lowers what the caller passed in (the index's estimate).
	got = []int{4, 1, 2}
	o.Estimate(chain, nodes, got, t0.Add(time.Second))
	if fmt.Sprint(got) != "[4 5 2]" {
		t.Fatalf("max %v", got)
	}
	// Expiry: never after the TTL, and not before 3/4 of it.
	got = []int{0, 0, 0}
	o.Estimate(chain, nodes, got, t0.Add(3*time.Second-time.Nanosecond))
	if fmt.Sprint(got) != "[3 5 0]" {
		t.Fatalf("before 3/4 ttl %v", got)
	}
	got = []int{0, 0, 0}
	o.Estimate(chain, nodes, got, t0.Add(4*time.Second))
	if fmt.Sprint(got) != "[0 5 0]" {
		t.Fatalf("a at ttl %v", got)
	}
	o.Expire(t0.Add(4 * time.Second))
	if st := o.Stats(); st.Pairs != 5 {
		t.Fatalf("after expire %+v", st)
	}
	o.Expire(t0.Add(5 * time.Second))
	if st := o.Stats(); st.Pairs != 0 {
		t.Fatalf("after expire %+v", st)
	}
	// Refresh: recording again extends.
	o.Record("a", chain, t0.Add(10*time.Second))
	o.Record("a", chain, t0.Add(13*time.Second))
	got = []int{0, 0, 0}
	o.Estimate(chain, nodes, got, t0.Add(15*time.Second))
	if got[0] != 5 {
		t.Fatalf("refresh %v", got)
	}
	o.ForgetNode("a")
	o.ForgetNode("zz")
	got = []int{0, 0, 0}
	o.Estimate(chain, nodes, got, t0.Add(15*time.Second))
	if got[0] != 0 || o.Stats().Pairs != 0 {
		t.Fatalf("forget %v %+v", got, o.Stats())
	}
	// A record from further back than the ring is refused, not misfiled.
	o.Record("a", chain, t0)
	if st := o.Stats(); st.Pairs != 0 || st.RefusedRecords != 5 {
		t.Fatalf("stale record %+v", st)
	}
}

func TestOverlayBound(t *testing.T) {
	t0 := time.Unix(50, 0)
	o := NewOverlay(time.Second, 10)
	chain := []uint64{1, 2, 3, 4, 5, 6, 7, 8}
	o.Record("a", chain, t0)
	o.Record("b", chain, t0) // only 2 fit
	if st := o.Stats(); st.Pairs != 10 || st.RefusedRecords != 6 {
		t.Fatalf("stats %+v", st)
	}
	got := []int{0, 0}
	o.Estimate(chain, []string{"a", "b"}, got, t0)
	if got[0] != 8 || got[1] != 2 {
		t.Fatalf("estimate %v", got)
	}
	// When full, Record first expires old buckets.
	o.Record("c", chain, t0.Add(2*time.Second))
	if st := o.Stats(); st.Pairs != 8 {
		t.Fatalf("stats after expiry-on-full %+v", st)
	}
}

func TestOverlayManyNodes(t *testing.T) {
	t0 := time.Unix(50, 0)
	o := NewOverlay(time.Second, 1<<16)
	chain := []uint64{11, 12, 13, 14, 15, 16, 17, 18, 19, 20}
	var ids []string
	for i := 0; i < 200; i++ {
		id := fmt.Sprintf("n%d", i)
		ids = append(ids, id)
		o.Record(id, chain[:i%11], t0)
	}
	got := make([]int, len(ids))
	o.Estimate(chain, ids, got, t0)
	for i := range ids {
		if got[i] != i%11 {
			t.Fatalf("node %d: %d want %d", i, got[i], i%11)
		}
	}
}

// Named ...Allocs so that scripts/test.sh's pass without the race detector runs it (under the
// race detector sync.Pool drops items at random and it skips).
func TestEstimateAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under the race detector; scripts/test.sh runs this test without it")
	}
	x := NewIndex(DefaultIndexConfig())
	o := NewOverlay(0, 0)
	t0 := time.Unix(50, 0)
	chain := make([]uint64, 512)
	for i := range chain {
		chain[i] = uint64(i + 1)
	}
	var ids []string
	for i := 0; i < 100; i++ {
		id := fmt.Sprintf("n%d", i)
		ids = append(ids, id)
		x.ReplaceNode(id, 1, 0, chain[:i*5])
		o.Record(id, chain[:i*3], t0)
	}
	got := make([]int, len(ids))
	x.Estimate(chain, ids, got)
	if n := testing.AllocsPerRun(100, func() {
		x.Estimate(chain, ids, got)
		o.Estimate(chain, ids, got, t0)
	}); n != 0 {
		t.Fatalf("%v allocations per estimate", n)
	}
}

func TestOverlayPending(t *testing.T) {
	o := NewOverlay(time.Second, 100)
	chain := []uint64{1, 2, 3, 4}
	nodes := []string{"a", "b"}
	est := func(at time.Time) string {
		got := []int{0, 0}
		o.Estimate(chain, nodes, got, at)
		return fmt.Sprint(got)
	}
	o.Begin("a", chain, t0)
	o.Begin("a", chain[:2], t0) // a second request sharing the prefix
	o.Begin("b", chain[:3], t0)
	// Pending holds do not expire: the requests are still queued a minute later.
	if got := est(t0.Add(time.Minute)); got != "[4 3]" {
		t.Fatalf("pending %s", got)
	}
	if st := o.Stats(); st.Pairs != 7 || st.Pending != 7 {
		t.Fatalf("stats %+v", st)
	}
	// The first request's first token: its hold becomes a TTL record; the second still holds 2.
	end := t0.Add(time.Minute)
	o.End("a", chain, end)
	if st := o.Stats(); st.Pending != 5 || st.Pairs != 9 {
		t.Fatalf("after End %+v", st)
	}
	if got := est(end.Add(time.Second)); got != "[2 3]" { // the record expired, the hold remains
		t.Fatalf("after ttl %s", got)
	}
	o.Abort("a", chain[:2])
	o.Abort("a", chain[:2]) // releasing twice is harmless
	if got := est(end.Add(time.Second)); got != "[0 3]" {
		t.Fatalf("after abort %s", got)
	}
	o.ForgetNode("b")
	o.Expire(end.Add(time.Second))
	if st := o.Stats(); st.Pairs != 0 || st.Pending != 0 || est(end) != "[0 0]" {
		t.Fatalf("after forget %+v %s", st, est(end))
	}
	// Holds count against the bound.
	small := NewOverlay(time.Second, 3)
	small.Begin("a", chain, t0)
	if st := small.Stats(); st.Pending != 3 || st.RefusedRecords != 1 {
		t.Fatalf("bound %+v", st)
	}
	small.End("a", chain, t0) // releases 3, records 3 of 4
	if st := small.Stats(); st.Pending != 0 || st.Pairs != 3 {
		t.Fatalf("bound after End %+v", st)
	}
}
