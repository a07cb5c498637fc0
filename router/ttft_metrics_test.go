package router

import (
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/prefixmesh/prefixmesh/routing"
)

// The learned fits are exported per node while the node is known and vanish when it leaves.
func TestTTFTCollectorFollowsTheIndex(t *testing.T) {
	idx := routing.NewIndex(routing.DefaultIndexConfig())
	idx.ReplaceNode("n1", 1, 0, nil)
	pol, err := routing.NewPolicy(routing.PolicyPrefixMesh, routing.DefaultPolicyConfig())
	if err != nil {
		t.Fatal(err)
	}
	dec, err := routing.NewDecider(idx, nil, pol, routing.DeciderConfig{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0)
	var c routing.Choice
	for i := 0; i < 10; i++ {
		toks := make([]uint32, 4096)
		if err := dec.Decide(&routing.DecideRequest{Tokens: toks}, []routing.NodeInfo{{ID: "n1", Alive: true}}, now, routing.CommitBegin, &c); err != nil {
			t.Fatal(err)
		}
		// 4,096 uncached tokens at a nominal 10k tokens/s answered in 0.8 s: twice as slow.
		c.Ticket.FirstToken(now.Add(800 * time.Millisecond))
		c.Ticket.Done(now.Add(time.Second), true)
		now = now.Add(time.Second)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewTTFTCollector(dec))
	if n := testutil.CollectAndCount(reg, "prefixmesh_router_ttft_fit_samples"); n != 1 {
		t.Fatalf("%d per-node sample series, want 1", n)
	}
	// Ten first tokens, each weighing 1 − 1/1024 less per later one (the node fit's memory).
	want := 0.0
	for range 10 {
		want = want*(1-1.0/1024) + 1
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := -1.0
	for _, mf := range mfs {
		if mf.GetName() == "prefixmesh_router_ttft_fit_samples" {
			got = mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	if math.Abs(got-want) > 1e-9 {
		t.Fatalf("samples %v, want %v", got, want)
	}
	if s := dec.LearnedTTFT("n1").Scale; !(s > 1) {
		t.Fatalf("a node twice as slow as nominal learned scale %v", s)
	}
	idx.RemoveNode("n1")
	if n := testutil.CollectAndCount(reg, "prefixmesh_router_ttft_fit_scale"); n != 0 {
		t.Fatalf("%d series left for a departed node", n)
	}
}
