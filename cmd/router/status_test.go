package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// statusPage is a router's /metrics as the router writes it, cut to the series status reads
// (plus one it must ignore), with two nodes: one routable, one draining and ejected before its
// first summary.
const statusPage = `# TYPE prefixmesh_router_node_info gauge
prefixmesh_router_node_info{kv_connector="none",model="llama",node="node-1",role="both"} 1
prefixmesh_router_node_info{kv_connector="nixl",model="llama",node="node-0",role="decode"} 1
# TYPE prefixmesh_router_node_blocks gauge
prefixmesh_router_node_blocks{node="node-0",tier="gpu"} 120
# TYPE prefixmesh_router_node_kv_capacity_blocks gauge
prefixmesh_router_node_kv_capacity_blocks{node="node-0"} 2048
prefixmesh_router_node_kv_capacity_blocks{node="node-1"} 1024
# TYPE prefixmesh_router_node_free_blocks gauge
prefixmesh_router_node_free_blocks{node="node-0"} 1900
# TYPE prefixmesh_router_node_running gauge
prefixmesh_router_node_running{node="node-0"} 3
# TYPE prefixmesh_router_node_waiting gauge
prefixmesh_router_node_waiting{node="node-0"} 1
# TYPE prefixmesh_router_node_queued_prefill_tokens gauge
prefixmesh_router_node_queued_prefill_tokens{node="node-0"} 4096
# TYPE prefixmesh_router_node_inflight gauge
prefixmesh_router_node_inflight{node="node-0"} 2
prefixmesh_router_node_inflight{node="node-1"} 0
# TYPE prefixmesh_router_node_report_age_seconds gauge
prefixmesh_router_node_report_age_seconds{node="node-0"} 0.25
# TYPE prefixmesh_router_node_synced gauge
prefixmesh_router_node_synced{node="node-0"} 1
prefixmesh_router_node_synced{node="node-1"} 0
# TYPE prefixmesh_router_node_draining gauge
prefixmesh_router_node_draining{node="node-0"} 0
prefixmesh_router_node_draining{node="node-1"} 1
# TYPE prefixmesh_router_node_cold gauge
prefixmesh_router_node_cold{node="node-0"} 0
prefixmesh_router_node_cold{node="node-1"} 0
# TYPE prefixmesh_router_node_ejected gauge
prefixmesh_router_node_ejected{node="node-0"} 0
prefixmesh_router_node_ejected{node="node-1"} 1
# TYPE prefixmesh_router_ttft_fit_scale gauge
prefixmesh_router_ttft_fit_scale{node="node-0"} 1.5
# TYPE prefixmesh_gossip_members gauge
prefixmesh_gossip_members{role="node"} 2
prefixmesh_gossip_members{role="router"} 1
# TYPE prefixmesh_pins_is_leader gauge
prefixmesh_pins_is_leader 1
# TYPE prefixmesh_router_decided_requests_total counter
prefixmesh_router_decided_requests_total 100
# TYPE prefixmesh_router_decided_prompt_tokens_total counter
prefixmesh_router_decided_prompt_tokens_total 10000
# TYPE prefixmesh_router_decided_matched_tokens_total counter
prefixmesh_router_decided_matched_tokens_total 6000
# TYPE prefixmesh_router_decided_uniform_matched_tokens_total counter
prefixmesh_router_decided_uniform_matched_tokens_total 2500.5
# TYPE prefixmesh_frontdoor_engine_prompt_tokens_total counter
prefixmesh_frontdoor_engine_prompt_tokens_total 8000
# TYPE prefixmesh_frontdoor_engine_cached_tokens_total counter
prefixmesh_frontdoor_engine_cached_tokens_total 4400
# TYPE prefixmesh_frontdoor_estimate_exact_total counter
prefixmesh_frontdoor_estimate_exact_total 76
# TYPE prefixmesh_frontdoor_estimate_compared_total counter
prefixmesh_frontdoor_estimate_compared_total 80
# TYPE prefixmesh_frontdoor_ttft_seconds histogram
prefixmesh_frontdoor_ttft_seconds_bucket{le="0.1"} 50
prefixmesh_frontdoor_ttft_seconds_bucket{le="0.25"} 90
prefixmesh_frontdoor_ttft_seconds_bucket{le="+Inf"} 100
prefixmesh_frontdoor_ttft_seconds_sum 12
prefixmesh_frontdoor_ttft_seconds_count 100
# TYPE prefixmesh_frontdoor_predicted_ttft_seconds histogram
prefixmesh_frontdoor_predicted_ttft_seconds_bucket{le="0.1"} 100
prefixmesh_frontdoor_predicted_ttft_seconds_bucket{le="+Inf"} 100
prefixmesh_frontdoor_predicted_ttft_seconds_sum 5
prefixmesh_frontdoor_predicted_ttft_seconds_count 100
# TYPE go_goroutines gauge
go_goroutines 42
`

// The expected table is worked out by hand from statusPage: hit ratios 6000/10000,
// 2500.5/10000 and 4400/8000; TTFT p50 is rank 50 of 100, the top of the first bucket (0.1 s),
// p99 falls in +Inf and reads as the highest finite bound (0.25 s), as histogram_quantile
// answers; the predicted histogram holds all 100 under 0.1 s, so p50 = 0.05 s and p99 = 0.099 s.
func TestStatusPrintsTheRoutersView(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, statusPage)
	}))
	defer srv.Close()
	var out, errb bytes.Buffer
	addr := strings.TrimPrefix(srv.URL, "http://")
	if code := runStatus(context.Background(), []string{"--addr", addr}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	want := "router " + addr + `: 2 nodes mirrored, 1 synced; gossip members: 2 node, 1 router; Raft leader: this router
decisions since start: 100; estimated hit ratio 60.0% (a cache-blind choice: 25.0%); engines observed 55.0%
front door: estimate == cached_tokens 95.0% of 80; TTFT p50 100ms p99 250ms observed, 50ms 99ms predicted (100 requests)

NODE    MODEL  ROLE         STATE                      GPU BLOCKS  CAPACITY  FREE  RUNNING  WAITING  QUEUED PREFILL  IN FLIGHT  TTFT SCALE  REPORT AGE
node-0  llama  decode/nixl  ok                         120         2048      1900  3        1        4096            2          1.50        250ms
node-1  llama  both         unsynced,draining,ejected  -           1024      0     0        0        0               0          -           -
`
	if got := out.String(); got != want {
		t.Fatalf("status printed\n%s\nwant\n%s", got, want)
	}

	out.Reset()
	if code := runStatus(context.Background(), []string{"--addr", srv.URL, "--json"}, &out, &errb); code != 0 {
		t.Fatalf("--json exit %d: %s", code, errb.String())
	}
	var st fleetStatus
	if err := json.Unmarshal(out.Bytes(), &st); err != nil {
		t.Fatalf("--json output: %v\n%s", err, out.String())
	}
	if len(st.Nodes) != 2 || st.Nodes[0].Blocks["gpu"] != 120 || st.Nodes[0].Role != "decode" || st.Nodes[0].KVConnector != "nixl" || *st.Router.ObservedHitRatio != 0.55 || st.Router.Accuracy["frontdoor"].Exact != 76 {
		t.Fatalf("--json: %+v", st)
	}
}

// A router that predates roles exports node_info without role labels: its nodes' ROLE is "-"
// (unknown), not a guess, and --json leaves the role out.
func TestStatusFromARouterWithoutRoles(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "# TYPE prefixmesh_router_node_info gauge\nprefixmesh_router_node_info{model=\"llama\",node=\"node-0\"} 1\n")
	}))
	defer srv.Close()
	var out, errb bytes.Buffer
	if code := runStatus(context.Background(), []string{"--addr", srv.URL}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	want := `NODE    MODEL  ROLE  STATE  CAPACITY  FREE  RUNNING  WAITING  QUEUED PREFILL  IN FLIGHT  TTFT SCALE  REPORT AGE
node-0  llama  -     ok     -         0     0        0        0               0          -           -
`
	if got := out.String(); !strings.HasSuffix(got, "\n\n"+want) {
		t.Fatalf("status printed\n%s\nwant the table\n%s", got, want)
	}
	out.Reset()
	if code := runStatus(context.Background(), []string{"--addr", srv.URL, "--json"}, &out, &errb); code != 0 || strings.Contains(out.String(), `"role"`) {
		t.Fatalf("--json: exit %d\n%s", code, out.String())
	}
}

// A page that is not a router's, an address with nothing behind it and a stray argument are
// errors with their own exit codes, never an empty table.
func TestStatusErrors(t *testing.T) {
	agent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "# TYPE prefixmesh_node_cache_entries gauge\nprefixmesh_node_cache_entries 3\n")
	}))
	defer agent.Close()
	notFound := httptest.NewServer(http.NotFoundHandler())
	defer notFound.Close()
	for _, tc := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"--addr", agent.URL}, 1, "no prefixmesh router series"},
		{[]string{"--addr", notFound.URL}, 1, "404"},
		{[]string{"--addr", agent.URL, "extra"}, 2, `unexpected argument "extra"`},
	} {
		var out, errb bytes.Buffer
		code := runStatus(context.Background(), tc.args, &out, &errb)
		if code != tc.code || !strings.Contains(errb.String(), tc.says) {
			t.Errorf("status %v: exit %d, stderr %q; want exit %d saying %q", tc.args, code, errb.String(), tc.code, tc.says)
		}
	}
}
