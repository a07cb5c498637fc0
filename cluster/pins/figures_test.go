package pins

import (
	"context"
	"flag"
	"slices"
	"testing"
	"time"

	"github.com/prefixmesh/prefixmesh/routing/sim"
)

var figures = flag.Bool("pins.figures", false, "measure and print pin write latency and failover time")

// percentile is sim.Percentile of unsorted latencies, p a fraction.
func percentile(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return sim.Percentile(s, 100*p)
}

// TestFigures prints the Raft figures: pin write latency with 3 voters on
// loopback (on the leader and forwarded from a follower) and the time from killing the leader to
// the next successful write, over repeated trials. Run with -pins.figures -v (without -race).
func TestFigures(t *testing.T) {
	if !*figures {
		t.Skip("run with -pins.figures -v")
	}
	t.Run("test-timeouts", func(t *testing.T) { runFigures(t, nil) })
	t.Run("default-timeouts", func(t *testing.T) {
		runFigures(t, func(cfg *Config) {
			d := DefaultConfig()
			cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout, cfg.CommitTimeout =
				d.HeartbeatTimeout, d.ElectionTimeout, d.LeaderLeaseTimeout, d.CommitTimeout
			cfg.WriteTimeout = d.WriteTimeout
		})
	})
}

func runFigures(t *testing.T, mutate func(*Config)) {
	c := newCluster(t, 3, mutate)
	ld := c.leader(10 * time.Second)
	mustWrite(t, ld.store, putAdapter(1))
	measure := func(s *Store, n int) []time.Duration {
		out := make([]time.Duration, 0, n)
		for i := 0; i < n; i++ {
			start := time.Now()
			mustWrite(t, s, Command{Op: OpPinAdapter, AdapterID: 1, Nodes: []string{"gpu-1", "gpu-2"}})
			out = append(out, time.Since(start))
		}
		return out
	}
	onLeader := measure(ld.store, 2000)
	forwarded := measure(c.follower().store, 2000)
	t.Logf("pin write latency, 3 voters, loopback: on the leader p50 %v p99 %v; forwarded from a follower p50 %v p99 %v (n=2000 each)",
		percentile(onLeader, .5), percentile(onLeader, .99), percentile(forwarded, .5), percentile(forwarded, .99))

	const trials = 20
	var failover []time.Duration
	for trial := 0; trial < trials; trial++ {
		ld := c.leader(10 * time.Second)
		var writer *Store
		idx := -1
		for i, nd := range c.nodes {
			if nd == ld {
				idx = i
			} else if writer == nil {
				writer = nd.store
			}
		}
		mustWrite(t, writer, putAdapter(1))
		start := time.Now()
		c.kill(idx)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, err := writer.Write(ctx, Command{Op: OpPinAdapter, AdapterID: 1, Nodes: []string{"gpu-3"}})
			cancel()
			if err == nil {
				break
			}
			if time.Since(start) > 30*time.Second {
				t.Fatalf("no successful write 30 s after killing the leader: %v", err)
			}
		}
		failover = append(failover, time.Since(start))
		c.start(idx, false)
		c.waitConverged(10 * time.Second)
	}
	cfg := testConfig("", "", "")
	if mutate != nil {
		mutate(&cfg)
	}
	t.Logf("leader kill → next successful write (heartbeat %v, election %v, lease %v): p50 %v p99 %v max %v (%d trials)",
		cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout,
		percentile(failover, .5), percentile(failover, .99), slices.Max(failover), trials)
}
