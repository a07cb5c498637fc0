package pins

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	cfg := testConfig("m", t.TempDir(), "127.0.0.1:0")
	cfg.Bootstrap = true
	cfg.Registerer = reg
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	waitFor(t, 10*time.Second, "leader", s.IsLeader)
	mustWrite(t, s, putAdapter(1))
	_, _ = s.Write(ctxT(t, time.Second), Command{Op: OpPinAdapter, AdapterID: 2, Nodes: []string{"a"}}) // NotFound
	want := map[string]bool{
		"prefixmesh_pins_write_seconds": false, "prefixmesh_pins_leader_changes_total": false,
		"prefixmesh_pins_applied_index": false, "prefixmesh_pins_read_staleness_seconds": false,
		"prefixmesh_pins_voters": false, "prefixmesh_pins_voter": false, "prefixmesh_pins_is_leader": false,
	}
	waitFor(t, 5*time.Second, "a leader change to be counted", func() bool {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			want[mf.GetName()] = true
			switch mf.GetName() {
			case "prefixmesh_pins_leader_changes_total":
				if mf.GetMetric()[0].GetCounter().GetValue() < 1 {
					return false
				}
			case "prefixmesh_pins_applied_index":
				if mf.GetMetric()[0].GetGauge().GetValue() < 2 {
					t.Fatalf("applied index gauge %v", mf.GetMetric()[0].GetGauge().GetValue())
				}
			case "prefixmesh_pins_voters", "prefixmesh_pins_is_leader":
				if v := mf.GetMetric()[0].GetGauge().GetValue(); v != 1 {
					t.Fatalf("%s = %v, want 1 (one voter, the leader)", mf.GetName(), v)
				}
			case "prefixmesh_pins_voter":
				if m := mf.GetMetric(); len(m) != 1 || m[0].GetLabel()[0].GetValue() != "m" {
					t.Fatalf("voter series: %v", m)
				}
			case "prefixmesh_pins_write_seconds":
				// Every outcome exists from the start; the two writes made count one each under
				// ok and error, none under unavailable.
				counts := map[string]uint64{}
				for _, m := range mf.GetMetric() {
					counts[m.GetLabel()[0].GetValue()] = m.GetHistogram().GetSampleCount()
				}
				if len(counts) != 3 || counts["ok"] != 1 || counts["error"] != 1 || counts["unavailable"] != 0 {
					t.Fatalf("write histogram counts by outcome: %v", counts)
				}
			}
		}
		return true
	})
	for name, seen := range want {
		if !seen {
			t.Errorf("metric %s not registered", name)
		}
	}
	// A second store on the same registry is refused rather than silently sharing metrics.
	if _, err := New(cfg); err == nil {
		t.Fatal("duplicate registration accepted")
	}
}
