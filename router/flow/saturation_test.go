package flow

import (
	"math"
	"testing"
	"time"
)

func TestScoreAndHeadroom(t *testing.T) {
	th := DefaultThresholds()
	for _, tc := range []struct {
		name  string
		nodes []NodeLoad
		mean  float64
		room  int
	}{
		{"no nodes", nil, math.Inf(1), 0},
		{"idle", []NodeLoad{{}, {}}, 0, 10},
		{"reported queue", []NodeLoad{{Waiting: 5}, {Waiting: 0}}, 0.5, 5},
		{"in flight beyond running counts as waiting", []NodeLoad{{Running: 2, InFlight: 7}, {}}, 0.5, 5},
		{"in flight below running adds nothing", []NodeLoad{{Running: 8, InFlight: 3}}, 0, 5},
		{"KV utilisation", []NodeLoad{{FreeBlocks: 20, CapacityBlocks: 100}}, 1, 0},
		{"KV half of its threshold", []NodeLoad{{FreeBlocks: 60, CapacityBlocks: 100}}, 0.5, 3},
		{"stale report is saturated", []NodeLoad{{LoadAge: 2 * time.Second}, {}}, 0.5, 5},
		{"all stale", []NodeLoad{{LoadAge: 2 * time.Second}, {LoadAge: 3 * time.Second}}, 1, 0},
		{"over", []NodeLoad{{Waiting: 12}, {Waiting: 0}}, 1.2, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mean, room := th.Headroom(tc.nodes)
			if math.Abs(mean-tc.mean) > 1e-9 && !(math.IsInf(mean, 1) && math.IsInf(tc.mean, 1)) || room != tc.room {
				t.Fatalf("mean %v headroom %d; want %v %d", mean, room, tc.mean, tc.room)
			}
		})
	}
}

// TestHeadroomNeverOvershoots: admitting the headroom one waiting request at a time onto the
// least saturated node never takes the mean past 1 by a whole request's share.
func TestHeadroomNeverOvershoots(t *testing.T) {
	th := DefaultThresholds()
	for n := 1; n <= 8; n++ {
		for w := 0; w < 12; w++ {
			nodes := make([]NodeLoad, n)
			nodes[0].Waiting = w
			_, room := th.Headroom(nodes)
			for range room {
				best := 0
				for i := range nodes {
					if th.Score(&nodes[i]) < th.Score(&nodes[best]) {
						best = i
					}
				}
				nodes[best].Waiting++
			}
			mean, _ := th.Headroom(nodes)
			if room > 0 && mean >= 1+1/(float64(n)*th.QueueDepth) {
				t.Fatalf("%d nodes, %d waiting: after the headroom the mean is %v", n, w, mean)
			}
		}
	}
}
