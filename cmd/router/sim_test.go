package main

import (
	"bytes"
	"context"
	"encoding/json"
	"image/png"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prefixmesh/prefixmesh/routing"
)

// simArgs runs `router sim` on a short slice of the standard trace (shipped in data/traces).
func simArgs(t *testing.T, extra ...string) (stdout string) {
	t.Helper()
	if _, err := findTrace(defaultTrace); err != nil {
		t.Fatalf("standard trace (shipped in data/traces): %v", err)
	}
	var out, errb bytes.Buffer
	args := append([]string{"--limit", "300", "--seed", "3", "--loss", "0.05"}, extra...)
	if code := runSim(context.Background(), args, &out, &errb); code != 0 {
		t.Fatalf("router sim %v: exit %d: %s", args, code, errb.String())
	}
	return out.String()
}

// TestSimDeterministicJSON: the same seed and flags give byte-identical JSON, however many
// policies run at once.
func TestSimDeterministicJSON(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.json"), filepath.Join(dir, "b.json")
	simArgs(t, "--json", a, "--parallel", "1")
	out := simArgs(t, "--json", b, "--parallel", "3")
	ja, err := os.ReadFile(a)
	if err != nil {
		t.Fatal(err)
	}
	jb, err := os.ReadFile(b)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ja, jb) {
		t.Fatalf("JSON differs between runs:\n%s\n---\n%s", ja, jb)
	}
	var doc struct {
		Policies []map[string]any `json:"policies"`
		Ref      map[string]any   `json:"reference"`
		Config   map[string]any   `json:"config"`
	}
	if err := json.Unmarshal(ja, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Policies) != len(routing.PolicyNames()) || doc.Config["requests"] != 300.0 {
		t.Fatalf("%d policies, config %v", len(doc.Policies), doc.Config)
	}
	for _, k := range []string{"name", "hit_ratio", "ttft_mean_s", "ttft_p50_s", "ttft_p99_s", "e2e_mean_s", "itl_mean_s", "itl_p99_s",
		"imbalance_prefill", "imbalance_inflight", "estimate_exact_share", "estimate_mae_tokens",
		"routers", "sharing", "share_bytes_per_router_per_s", "node_gossip_bytes_per_node_per_s", "share_messages",
		"share_lost", "repairs", "staggered_share", "stagger_mean_ms"} {
		if _, ok := doc.Policies[0][k]; !ok {
			t.Fatalf("policy row lacks %q: %v", k, doc.Policies[0])
		}
	}
	// Besides those, only the peer-pull fields, present when a run planned a pull.
	base := 0
	for k := range doc.Policies[0] {
		if !strings.HasPrefix(k, "peer_pull_") {
			base++
		}
	}
	if base != 21 || len(doc.Ref) != 2 {
		t.Fatalf("unexpected keys: %v %v", doc.Policies[0], doc.Ref)
	}
	for _, want := range []string{"prefixmesh", "dynamo-cost", "pooled LRU (reference, not a bound)", "infinite cache (bound)"} {
		if !strings.Contains(out, want) {
			t.Fatalf("table lacks %q:\n%s", want, out)
		}
	}
}

func TestSimPlot(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "sim.png")
	simArgs(t, "--policies", "prefixmesh,round-robin", "--plot", p)
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() < 800 || b.Dy() < 600 {
		t.Fatalf("plot is %v", b)
	}
}

func TestSimBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--policies", "nope"},
		{"--nodes", "0"},
		{"--trace", "/nonexistent/trace.jsonl"},
		{"--speed", "0"},
		{"--arrival-quantum", "-1s"},
		{"--policies", "prefixmesh-gpu"}, // without a CPU tier it is prefixmesh
		{"--cpu-blocks", "-1"},
		{"--cpu-blocks", "10", "--cpu-chunk-blocks", "4"},
		{"--cpu-blocks", "16", "--cpu-chunk-blocks", "0"},
		{"--cpu-blocks", "16", "--cpu-load-tokens-per-s", "0"},
		{"--token-budget", "-1"},
		{"--disaggregate", "llmd"}, // no prefill nodes to send a prefill to
		{"--prefill-nodes", "8"},   // no decode node left
		{"--prefill-nodes", "-1"},
		{"--prefill-nodes", "2", "--disaggregate", "sometimes"},
		{"--prefill-nodes", "2", "--kv-transfer-tokens-per-s", "0"},
		{"--prefill-nodes", "2", "--kv-transfer-overhead", "-1ms"},
		{"--prefill-nodes", "2", "--llmd-non-cached-tokens", "-1"},
		{"extra"},
	} {
		var out, errb bytes.Buffer
		if code := runSim(context.Background(), args, &out, &errb); code == 0 {
			t.Fatalf("%v: exit 0", args)
		}
	}
}

// --arrival-quantum replays the trace in bursts: the config says so, the table's header says
// so, and the numbers differ from the trace as recorded (300 requests over ~90 s of the
// standard trace become ~30 instants of ~10 simultaneous requests).
func TestSimArrivalQuantum(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.json"), filepath.Join(dir, "b.json")
	simArgs(t, "--policies", "round-robin", "--json", a)
	out := simArgs(t, "--policies", "round-robin", "--json", b, "--arrival-quantum", "3s")
	if !strings.Contains(out, "arrivals rounded down to 3s") {
		t.Fatalf("table header lacks the quantum:\n%s", out)
	}
	read := func(p string) (cfg map[string]any, ttft float64) {
		var doc struct {
			Policies []map[string]any `json:"policies"`
			Config   map[string]any   `json:"config"`
		}
		raw, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(raw, &doc); err != nil {
			t.Fatal(err)
		}
		return doc.Config, doc.Policies[0]["ttft_mean_s"].(float64)
	}
	ca, ta := read(a)
	cb, tb := read(b)
	if ca["arrival_quantum_s"] != 0.0 || cb["arrival_quantum_s"] != 3.0 {
		t.Fatalf("arrival_quantum_s %v, %v", ca["arrival_quantum_s"], cb["arrival_quantum_s"])
	}
	if ta == tb {
		t.Fatalf("the same mean TTFT %v with and without bursts", ta)
	}
}

// --cpu-blocks, --cpu-chunk-blocks and --cpu-load-tokens-per-s reach the nodes and the JSON
// config; the table's header names the tier and a column shows the hits it loaded; and the
// GPU-only prefixmesh runs beside prefixmesh.
func TestSimCPUTierFlags(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "tiers.json")
	out := simArgs(t, "--policies", "prefixmesh,prefixmesh-gpu", "--kv-blocks", "2048", "--cpu-blocks", "8192",
		"--cpu-chunk-blocks", "2", "--cpu-load-tokens-per-s", "120000", "--json", p)
	var doc struct {
		Policies []map[string]any `json:"policies"`
		Config   map[string]any   `json:"config"`
	}
	raw, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	if c := doc.Config; c["cpu_blocks"] != 8192.0 || c["cpu_chunk_blocks"] != 2.0 || c["cpu_load_tokens_per_s"] != 120000.0 || c["kv_blocks"] != 2048.0 {
		t.Fatalf("config %v", c)
	}
	if len(doc.Policies) != 2 || doc.Policies[1]["name"] != "prefixmesh-gpu" {
		t.Fatalf("policies %v", doc.Policies)
	}
	for _, r := range doc.Policies {
		if v, _ := r["cpu_hit_ratio"].(float64); !(v > 0) {
			t.Fatalf("%v: no hits loaded from the CPU tier", r["name"])
		}
	}
	for _, want := range []string{"+ a CPU tier of 8192 blocks (chunks of 2), loaded at 120000 tok/s", "of it CPU %", "prefixmesh-gpu"} {
		if !strings.Contains(out, want) {
			t.Fatalf("table lacks %q:\n%s", want, out)
		}
	}

	// Without the tier the JSON says so (0 blocks) and no row has CPU hits.
	q := filepath.Join(dir, "none.json")
	simArgs(t, "--policies", "prefixmesh", "--json", q)
	raw, err = os.ReadFile(q)
	if err != nil {
		t.Fatal(err)
	}
	doc.Policies, doc.Config = nil, nil
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	if _, has := doc.Policies[0]["cpu_hit_ratio"]; has || doc.Config["cpu_blocks"] != 0.0 {
		t.Fatalf("without a tier: config %v, row %v", doc.Config, doc.Policies[0])
	}
}

// "all" lists prefixmesh-gpu, after prefixmesh, only when the nodes have a CPU tier.
func TestSimPolicyList(t *testing.T) {
	withTiers := slices.Insert(routing.PolicyNames(), 1, routing.PolicyPrefixMeshGPU)
	for _, c := range []struct {
		arg   string
		tiers bool
		want  []string
	}{
		{"all", false, routing.PolicyNames()},
		{"all", true, withTiers},
		{"", true, withTiers},
		{"prefixmesh-gpu, dynamo-cost,prefixmesh-gpu", true, []string{"prefixmesh-gpu", "dynamo-cost"}},
		{"llm-d", false, []string{"llm-d"}},
	} {
		got, err := parsePolicies(c.arg, c.tiers)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("parsePolicies(%q, tiers %v) = %v, %v; want %v", c.arg, c.tiers, got, err, c.want)
		}
	}
	if _, err := parsePolicies("prefixmesh,prefixmesh-gpu", false); err == nil {
		t.Error("prefixmesh-gpu accepted without a CPU tier")
	}
}

// --prefill-nodes with a list of --disaggregate modes: a run per mode and policy, each row and
// the config saying which, the table with the rule and its remote share.
func TestSimDisaggregateFlags(t *testing.T) {
	p := filepath.Join(t.TempDir(), "pd.json")
	out := simArgs(t, "--policies", "prefixmesh", "--prefill-nodes", "2", "--disaggregate", "auto,llmd,dynamo",
		"--kv-transfer-tokens-per-s", "50000", "--json", p)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Policies []map[string]any `json:"policies"`
		Config   map[string]any   `json:"config"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Policies) != 3 {
		t.Fatalf("%d runs, want 3", len(doc.Policies))
	}
	for i, m := range []string{"auto", "llmd", "dynamo"} {
		if r := doc.Policies[i]; r["disaggregate"] != m || r["prefill_nodes"] != 2.0 {
			t.Fatalf("run %d: %v", i, r)
		}
	}
	c := doc.Config
	if c["prefill_nodes"] != 2.0 || c["kv_transfer_tokens_per_s"] != 50000.0 || c["llmd_non_cached_tokens"] != 512.0 ||
		!slices.Equal(c["disaggregate"].([]any), []any{"auto", "llmd", "dynamo"}) {
		t.Fatalf("config %v", c)
	}
	for _, want := range []string{"P/D", "remote %", "ITL p99 ms", "nodes 0-1 prefill, 6 decode", "dynamo"} {
		if !strings.Contains(out, want) {
			t.Fatalf("table lacks %q:\n%s", want, out)
		}
	}
}
