package pins

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// blackHole accepts TCP connections and never answers: a SIGSTOPped process, whose kernel still
// completes handshakes into the listen backlog. accepted is closed once the first connection
// arrives: the event that someone is now waiting on the hole.
func blackHole(t *testing.T) (addr string, accepted <-chan struct{}) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	first := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			if len(conns) == 0 {
				close(first)
			}
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = lis.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return lis.Addr().String(), first
}

// testBound is the context of a wait that only an event ends: it is bounded by the test
// binary's own deadline (go test -timeout), less a margin to report what was seen, rather than
// by a budget that the machine's load could exhaust.
func testBound(t *testing.T) context.Context {
	deadline, ok := t.Deadline()
	if !ok {
		deadline = time.Now().Add(5 * time.Minute)
	}
	margin := time.Until(deadline) / 10
	ctx, cancel := context.WithDeadline(t.Context(), deadline.Add(-margin))
	t.Cleanup(cancel)
	return ctx
}

// TestForwardToFrozenLeaderRetriesCAS is the frozen leader: a follower forwards a write to a
// leader that has stopped answering (its gRPC a black hole, then its Raft cut off); the others
// elect a new leader, and the follower abandons the hung call and retries a compare-and-set there.
// An unconditional write, whose retry could apply twice, fails as unknown instead.
//
// Each step waits for an event, never for a time: the leader is frozen for Raft only once the
// forwarded call has reached its black hole, so the follower cannot learn of a successor first,
// and the write is given until the test binary's deadline to ride the election.
func TestForwardToFrozenLeaderRetriesCAS(t *testing.T) {
	slow := func(c *Config) {
		// Slower than the suite's 100 ms so that the race detector's pauses under load do not
		// move leadership before the test freezes the leader.
		c.HeartbeatTimeout, c.ElectionTimeout, c.LeaderLeaseTimeout = 500*time.Millisecond, 500*time.Millisecond, 500*time.Millisecond
	}
	for _, cas := range []bool{true, false} {
		name := "unconditional"
		if cas {
			name = "cas"
		}
		t.Run(name, func(t *testing.T) {
			c := newCluster(t, 3, slow)
			ld := c.leader(10 * time.Second)
			var others []string
			var fol *testNode
			for _, nd := range c.live() {
				if nd != ld {
					others = append(others, nd.raftAddr)
					fol = nd
				}
			}
			// Freeze the leader's gRPC first: Raft still sees it lead, so the follower forwards there.
			hole, accepted := blackHole(t)
			for _, nd := range c.live() {
				nd.store.SetPeer(ld.id, hole)
			}
			cmd := Command{Op: OpPutAdapter, Adapter: Adapter{ID: 7, Name: "a"}}
			if cas {
				cmd.Cond = IfVersion(0)
			}
			ctx := testBound(t)
			type outcome struct {
				r   Result
				err error
			}
			res := make(chan outcome, 1)
			go func() {
				r, err := fol.store.Write(ctx, cmd)
				res <- outcome{r, err}
			}()
			select {
			case <-accepted:
			case o := <-res:
				t.Fatalf("the write ended (%+v, %v) before reaching the frozen leader: leadership moved on its own", o.r, o.err)
			case <-ctx.Done():
				t.Fatal("the follower never forwarded the write to the frozen leader")
			}
			// Now freeze its Raft too: the others elect a successor, which the follower sees.
			c.fault.partition(ld.raftAddr, others...)
			var o outcome
			select {
			case o = <-res:
			case <-ctx.Done():
				t.Fatal("the write did not end by the test's deadline")
			}
			retries := counterValue(fol.store.metrics.forwardRetries)
			t.Logf("write through %s with leader %s frozen: %v (%v retries)", fol.id, ld.id, o.err, retries)
			if !cas {
				if !errors.Is(o.err, ErrUnavailable) {
					t.Fatalf("unconditional write to a frozen leader: %v, want ErrUnavailable", o.err)
				}
				return
			}
			if o.err != nil {
				views := map[string]string{}
				for _, nd := range c.live() {
					views[nd.id], _ = nd.store.Leader()
				}
				t.Fatalf("CAS write did not survive the leader change: %v (leaders seen: %v)", o.err, views)
			}
			if retries < 1 {
				t.Fatal("the write reached the frozen leader but was never retried")
			}
			if o.r.Index == 0 {
				t.Fatalf("result %+v", o.r)
			}
			dl, _ := ctx.Deadline()
			waitFor(t, time.Until(dl), "the follower to apply the write", func() bool { return fol.store.fsm.AppliedIndex() >= o.r.Index })
			if v := fol.store.View(); len(v.Adapters) != 1 || v.Adapters[0].ID != 7 {
				t.Fatalf("table after the write: %+v", v.Adapters)
			}
		})
	}
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}
