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
// completes handshakes into the listen backlog.
func blackHole(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
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
	return lis.Addr().String()
}

// TestForwardToFrozenLeaderRetriesCAS is a frozen leader: a follower forwards a write
// to a leader that has stopped answering (its gRPC a black hole, its Raft cut off); the others
// elect a new leader, and the follower abandons the hung call and retries a compare-and-set there
// within the caller's deadline. An unconditional write, whose retry could apply twice, fails as
// unknown instead.
func TestForwardToFrozenLeaderRetriesCAS(t *testing.T) {
	slow := func(c *Config) {
		// The follower keeps believing in the frozen leader for a while: the write must be
		// forwarded to it, not straight to its successor.
		c.HeartbeatTimeout, c.ElectionTimeout, c.LeaderLeaseTimeout = 500*time.Millisecond, 500*time.Millisecond, 500*time.Millisecond
		c.WriteTimeout = 20 * time.Second
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
			hole := blackHole(t)
			for _, nd := range c.live() {
				nd.store.SetPeer(ld.id, hole)
			}
			c.fault.partition(ld.raftAddr, others...)
			cmd := Command{Op: OpPutAdapter, Adapter: Adapter{ID: 7, Name: "a"}}
			if cas {
				cmd.Cond = IfVersion(0)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			start := time.Now()
			r, err := fol.store.Write(ctx, cmd)
			took := time.Since(start)
			retries := counterValue(fol.store.metrics.forwardRetries)
			t.Logf("write through %s with leader %s frozen: %v after %v (%v retries)", fol.id, ld.id, err, took, retries)
			if !cas {
				if !errors.Is(err, ErrUnavailable) {
					t.Fatalf("unconditional write to a frozen leader: %v, want ErrUnavailable", err)
				}
				return
			}
			if err != nil {
				views := map[string]string{}
				for _, nd := range c.live() {
					views[nd.id], _ = nd.store.Leader()
				}
				t.Fatalf("CAS write did not survive the leader change: %v (leaders seen: %v)", err, views)
			}
			if retries < 1 {
				t.Fatal("the write was never forwarded to the frozen leader; the test did not exercise the retry")
			}
			if r.Index == 0 {
				t.Fatalf("result %+v", r)
			}
			waitFor(t, 10*time.Second, "the follower to apply the write", func() bool { return fol.store.fsm.AppliedIndex() >= r.Index })
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
