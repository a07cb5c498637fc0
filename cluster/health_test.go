package cluster

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// TestHealthIsolatedMember: a member with the wrong key never joins and says so; a member that
// joined is healthy with member counts, and reports losing its last peer.
func TestHealthIsolatedMember(t *testing.T) {
	routers, nodes := startCluster(t, 1, 1)
	seed := routers[0].agent.GossipAddr()

	cfg := testConfig(RoleNode, "intruder")
	cfg.Keys = [][]byte{[]byte("fedcba9876543210")}
	cfg.Join = []string{seed}
	bad, err := New(cfg, Deps{Source: newFakeSource()})
	if err != nil {
		t.Fatal(err)
	}
	if h := bad.Health(); h.OK {
		t.Fatal("an agent that has not started reports healthy")
	}
	if err := bad.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer bad.Close(context.Background())
	waitFor(t, settle, "join failures counted", func() (bool, string) {
		h := bad.Health()
		return !h.OK && strings.Contains(h.Reason, "not joined") && strings.Contains(h.Reason, seed) &&
			counterValue(bad.metrics.joinFailures) >= 2, h.Reason
	})
	t.Logf("wrong key: %s", bad.Health().Reason)

	cfg = testConfig(RoleNode, "good")
	cfg.Join = []string{seed}
	good, err := New(cfg, Deps{Source: newFakeSource()})
	if err != nil {
		t.Fatal(err)
	}
	if err := good.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer good.Close(context.Background())
	waitFor(t, settle, "healthy after join", func() (bool, string) {
		h := good.Health()
		return h.OK && h.Members == 3 && h.Nodes == 2 && h.Routers == 1, h.Reason
	})

	// WatchHealth reports the change when every peer leaves.
	changes := make(chan Health, 16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		good.WatchHealth(ctx, 5*time.Millisecond, func(h Health) { changes <- h })
	}()
	defer func() { cancel(); <-done }()
	if h := <-changes; !h.OK {
		t.Fatalf("first watched health: %+v", h)
	}
	nodes[0].stop()
	_ = routers[0].agent.Close(context.Background())
	deadline := time.After(settle)
	for {
		select {
		case h := <-changes:
			if h.OK {
				continue
			}
			if h.Members != 1 || !strings.Contains(h.Reason, "lost every gossip peer") {
				t.Fatalf("isolated health %+v", h)
			}
			if v := gaugeValue(good.metrics.isolated); v != 1 {
				t.Fatalf("isolated gauge %v", v)
			}
			return
		case <-deadline:
			t.Fatalf("no unhealthy report within %v: %+v", settle, good.Health())
		}
	}
}

func TestJoinLoggerBacksOff(t *testing.T) {
	var j joinLogger
	now := time.Unix(0, 0)
	var warned []int
	for i := 1; i <= 200; i++ {
		if j.warn(now, time.Second) {
			warned = append(warned, i)
		}
		now = now.Add(time.Second)
	}
	// Gaps of 2, 4, 8, 16, 32 then 60 s: 1, 3, 7, 15, 31, 63, 123, 183.
	want := []int{1, 3, 7, 15, 31, 63, 123, 183}
	if len(warned) != len(want) {
		t.Fatalf("warned at %v, want %v", warned, want)
	}
	for i := range want {
		if warned[i] != want[i] {
			t.Fatalf("warned at %v, want %v", warned, want)
		}
	}
	j.reset()
	if !j.warn(now, time.Second) {
		t.Fatal("first failure after a reset not warned")
	}
}

func gaugeValue(g prometheus.Gauge) float64 {
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		return -1
	}
	return m.GetGauge().GetValue()
}
