package cluster

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// productionTimers restores the default publish, load and heartbeat intervals (the test config
// shortens them), so that the figures are what a deployment sees.
func productionTimers(c *Config) {
	d := DefaultConfig(c.Meta.Role, c.Meta.NodeID)
	c.PublishInterval, c.LoadInterval, c.HeartbeatInterval = d.PublishInterval, d.LoadInterval, d.HeartbeatInterval
	c.SilenceTimeout, c.LagTimeout = d.SilenceTimeout, d.LagTimeout
}

// BenchmarkInsertToRouters measures the time from an insert on a node's tree to both routers'
// indexes holding it, with the default 20 ms journal poll, over real memberlist on loopback.
// Reported: p50 and p99 in ms (ns/op is the mean).
func BenchmarkInsertToRouters(b *testing.B) {
	for _, n := range []int{16, 64} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			r0 := startRouter(b, "router-0", nil, productionTimers)
			seed := []string{r0.agent.GossipAddr()}
			routers := []*testRouter{r0, startRouter(b, "router-1", seed, productionTimers)}
			nodes := make([]*testNode, n)
			for i := range nodes {
				nodes[i] = startNode(b, fmt.Sprintf("node-%d", i), seed, productionTimers)
			}
			waitFor(b, 2*time.Minute, "synced", func() (bool, string) { return synced(routers, nodes) })
			rng := rand.New(rand.NewPCG(7, 8))
			var blk uint32
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				nd := nodes[rng.IntN(n)]
				start := time.Now()
				insert(nd.tree, prompt(uint32(i+10), 0, 0, 8*testBlockSize), &blk)
				head := nd.tree.SummaryHead()
				for _, r := range routers {
					for {
						if _, seq, _, ok := r.idx.NodeState(nd.id); ok && seq >= head {
							break
						}
						time.Sleep(50 * time.Microsecond)
					}
				}
				lat = append(lat, time.Since(start))
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
		})
	}
}

// BenchmarkGossipBytesPerNode drives one node at 1,000 block changes per second (8-block
// prompts inserted and evicted in turn every 8 ms) for one second per iteration and reports the
// gossip bytes it sent per second to each router (deltas plus state packets, before memberlist's
// own framing of ~35 bytes per packet with encryption and a label) and packets per second.
func BenchmarkGossipBytesPerNode(b *testing.B) {
	r := startRouter(b, "router-0", nil, productionTimers)
	nd := startNode(b, "node-0", []string{r.agent.GossipAddr()}, productionTimers)
	waitFor(b, time.Minute, "synced", func() (bool, string) { return synced([]*testRouter{r}, []*testNode{nd}) })
	var blk uint32
	sent := func() (float64, float64) {
		var bytes, pkts float64
		for _, t := range []string{"delta", "state"} {
			bytes += counterValue(nd.agent.metrics.bytesSent.WithLabelValues(t))
			pkts += counterValue(nd.agent.metrics.packetsSent.WithLabelValues(t))
		}
		return bytes, pkts
	}
	b.ResetTimer()
	var totalBytes, totalPkts, changes float64
	var elapsed time.Duration
	for i := 0; i < b.N; i++ {
		h0 := nd.tree.SummaryHead()
		b0, p0 := sent()
		start := time.Now()
		tick := time.NewTicker(8 * time.Millisecond)
		for k := 0; time.Since(start) < time.Second; k++ {
			<-tick.C
			if k%2 == 0 {
				insert(nd.tree, prompt(uint32(1000+i*1000+k), 0, 0, 8*testBlockSize), &blk)
			} else {
				nd.tree.Evict(8)
			}
		}
		tick.Stop()
		elapsed += time.Since(start)
		time.Sleep(100 * time.Millisecond) // let the last poll go out (not timed: elapsed is set)
		b1, p1 := sent()
		changes += float64(nd.tree.SummaryHead() - h0)
		totalBytes += b1 - b0
		totalPkts += p1 - p0
	}
	b.StopTimer()
	b.ReportMetric(totalBytes/elapsed.Seconds(), "bytes/s/router")
	b.ReportMetric(totalPkts/elapsed.Seconds(), "pkts/s/router")
	b.ReportMetric(changes/elapsed.Seconds(), "changes/s")
	b.ReportMetric(totalBytes/changes, "bytes/change")
}

// BenchmarkDeltaCodec is the per-packet encode+decode cost of a full delta.
func BenchmarkDeltaCodec(b *testing.B) {
	d := Delta{NodeID: "node-17", Epoch: 1, FromSeq: 10, EmitUnix: 1}
	for i := 0; i < MaxDeltaEvents(len(d.NodeID)); i++ {
		d.Events = append(d.Events, Event{Hash: uint64(i) * 0x9e3779b97f4a7c15, Added: i%2 == 0})
	}
	d.ToSeq = d.FromSeq + uint64(len(d.Events))
	buf := make([]byte, 0, MaxPacketBytes)
	var out Delta
	b.ReportAllocs()
	b.SetBytes(int64(len(d.Events)) * 8)
	for i := 0; i < b.N; i++ {
		buf, _ = d.AppendBinary(buf[:0])
		if err := out.UnmarshalBinary(buf); err != nil {
			b.Fatal(err)
		}
	}
}
