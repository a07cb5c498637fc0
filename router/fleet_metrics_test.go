package router

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/prefixmesh/prefixmesh/cluster"
	"github.com/prefixmesh/prefixmesh/local"
	"github.com/prefixmesh/prefixmesh/routing"
)

// The fleet collector reports each mirrored node as the mirror, the index and passive health
// see it, and nothing for a node that left; the expected exposition is written by hand from the
// fixture.
func TestFleetCollector(t *testing.T) {
	now := time.Unix(1000, 0)
	idx := routing.NewIndex(routing.DefaultIndexConfig())
	toks := make([]uint32, 48)
	for i := range toks {
		toks[i] = uint32(i + 1)
	}
	idx.ReplaceNode("n1", 1, 5, local.BlockHashes(toks, 16, 0)) // 3 blocks
	pol, err := routing.NewPolicy(routing.PolicyPrefixMesh, routing.DefaultPolicyConfig())
	if err != nil {
		t.Fatal(err)
	}
	dec, err := routing.NewDecider(idx, routing.NewOverlay(0, 0), pol, routing.DeciderConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var c routing.Choice
	if err := dec.Decide(&routing.DecideRequest{Tokens: toks}, []routing.NodeInfo{{ID: "n1", Alive: true, BlockSize: 16}}, now, routing.CommitBegin, &c); err != nil {
		t.Fatal(err)
	}
	mirror := fakeMirror{
		{Meta: cluster.Meta{NodeID: "n1", Model: "m", KVCapacity: 100}, Synced: true, LoadRecv: now.Add(-1500 * time.Millisecond),
			Load: cluster.Load{Running: 2, Waiting: 1, FreeBlocks: 40, QueuedPrefillTokens: 300}},
		{Meta: cluster.Meta{NodeID: "n2", Model: "m", KVCapacity: 50, Draining: true, Cold: true,
			Serving: cluster.ServePrefill, KVConnector: cluster.KVConnectorNIXL}},
	}
	col := NewFleetCollector(FleetSource{Mirror: mirror, Blocks: idx.NodeState, Decider: dec, Now: func() time.Time { return now },
		Ejected: func(id string) bool { return id == "n2" }})
	// One decision of 48 tokens whose prompt n1 holds whole: the engine reports 32 (the last
	// token is recomputed, so the last full block is too); one candidate, so the mean is 32.
	// n1's metadata names no role (a node older than roles): both, no connector.
	want := `
# HELP prefixmesh_router_node_info 1 for every node the router mirrors, with its model, serving role (prefill, decode, both) and KV connector (none, nixl, sglang).
# TYPE prefixmesh_router_node_info gauge
prefixmesh_router_node_info{kv_connector="none",model="m",node="n1",role="both"} 1
prefixmesh_router_node_info{kv_connector="nixl",model="m",node="n2",role="prefill"} 1
# HELP prefixmesh_router_node_blocks KV blocks the router's index holds for the node, by tier.
# TYPE prefixmesh_router_node_blocks gauge
prefixmesh_router_node_blocks{node="n1",tier="all"} 3
# HELP prefixmesh_router_node_ejected 1 while passive health keeps the node out of the candidates.
# TYPE prefixmesh_router_node_ejected gauge
prefixmesh_router_node_ejected{node="n1"} 0
prefixmesh_router_node_ejected{node="n2"} 1
# HELP prefixmesh_router_node_inflight This router's own requests in flight to the node.
# TYPE prefixmesh_router_node_inflight gauge
prefixmesh_router_node_inflight{node="n1"} 1
prefixmesh_router_node_inflight{node="n2"} 0
# HELP prefixmesh_router_node_report_age_seconds Time since the router received the node's last load and summary report.
# TYPE prefixmesh_router_node_report_age_seconds gauge
prefixmesh_router_node_report_age_seconds{node="n1"} 1.5
# HELP prefixmesh_router_node_running Sequences running on the node, as it last reported.
# TYPE prefixmesh_router_node_running gauge
prefixmesh_router_node_running{node="n1"} 2
prefixmesh_router_node_running{node="n2"} 0
# HELP prefixmesh_router_node_cold 1 while the node's cache view may hold blocks its engine lost (routed by load only).
# TYPE prefixmesh_router_node_cold gauge
prefixmesh_router_node_cold{node="n1"} 0
prefixmesh_router_node_cold{node="n2"} 1
# HELP prefixmesh_router_node_synced 1 once the index has held a full summary of the node's current epoch.
# TYPE prefixmesh_router_node_synced gauge
prefixmesh_router_node_synced{node="n1"} 1
prefixmesh_router_node_synced{node="n2"} 0
# HELP prefixmesh_router_decided_matched_tokens_total Estimated reused tokens on the chosen nodes (as the engines will report cached_tokens).
# TYPE prefixmesh_router_decided_matched_tokens_total counter
prefixmesh_router_decided_matched_tokens_total 32
# HELP prefixmesh_router_decided_uniform_matched_tokens_total Mean estimated reused tokens over each decision's candidates: what a cache-blind (round-robin or random) choice would reuse.
# TYPE prefixmesh_router_decided_uniform_matched_tokens_total counter
prefixmesh_router_decided_uniform_matched_tokens_total 32
`
	names := []string{"prefixmesh_router_node_info", "prefixmesh_router_node_blocks", "prefixmesh_router_node_ejected", "prefixmesh_router_node_inflight",
		"prefixmesh_router_node_report_age_seconds", "prefixmesh_router_node_running", "prefixmesh_router_node_cold",
		"prefixmesh_router_node_synced", "prefixmesh_router_decided_matched_tokens_total", "prefixmesh_router_decided_uniform_matched_tokens_total"}
	if err := testutil.CollectAndCompare(col, strings.NewReader(want), names...); err != nil {
		t.Fatal(err)
	}
	// n2 leaves: its series go with it.
	col.src.Mirror = mirror[:1]
	if n := testutil.CollectAndCount(col, "prefixmesh_router_node_info"); n != 1 {
		t.Fatalf("node_info series after n2 left: %d, want 1", n)
	}
}

// BenchmarkFleetCollector is the fleet series' cost per scrape (ns/op is one whole Gather) at
// a large fleet's size. The baseline beside it holds the same number of per-node series in
// GaugeVecs, set as they change, as a conventionally instrumented router would: the cost of
// reading the view at scrape time instead is the difference.
func BenchmarkFleetCollector(b *testing.B) {
	const nodes = 1000
	idx := routing.NewIndex(routing.DefaultIndexConfig())
	pol, err := routing.NewPolicy(routing.PolicyPrefixMesh, routing.DefaultPolicyConfig())
	if err != nil {
		b.Fatal(err)
	}
	dec, err := routing.NewDecider(idx, routing.NewOverlay(0, 0), pol, routing.DeciderConfig{})
	if err != nil {
		b.Fatal(err)
	}
	var mirror fakeMirror
	now := time.Unix(1000, 0)
	for i := range nodes {
		id := fmt.Sprintf("node-%d", i)
		idx.ReplaceNode(id, 1, 1, []uint64{uint64(i + 1)})
		mirror = append(mirror, cluster.NodeStatus{Meta: cluster.Meta{NodeID: id, Model: "m", KVCapacity: 4096}, Synced: true, LoadRecv: now})
	}
	b.Run("gaugevec-baseline", func(b *testing.B) {
		const perNode = 14 // the fleet collector's per-node series
		vecs := make([]*prometheus.GaugeVec, perNode)
		reg := prometheus.NewRegistry()
		for j := range vecs {
			vecs[j] = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: fmt.Sprintf("baseline_%d", j), Help: "h"}, []string{"node"})
			reg.MustRegister(vecs[j])
			for _, n := range mirror {
				vecs[j].WithLabelValues(n.Meta.NodeID).Set(1)
			}
		}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := reg.Gather(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("fleet-gather", func(b *testing.B) {
		reg := prometheus.NewRegistry()
		reg.MustRegister(NewFleetCollector(FleetSource{Mirror: mirror, Blocks: idx.NodeState, Decider: dec, Now: func() time.Time { return now }}))
		b.ReportAllocs()
		for b.Loop() {
			if _, err := reg.Gather(); err != nil {
				b.Fatal(err)
			}
		}
	})
}
