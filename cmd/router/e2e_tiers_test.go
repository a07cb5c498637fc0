package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/prefixmesh/prefixmesh/local"
	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
)

// TestTierCreditEndToEnd is the KV-tier path over real daemons: two simulated engines (a 48-block
// GPU pool each, a CPU tier the pool spills into, published as vLLM's CPU events), the node agents
// mirroring them, and a router.
//
//   - node-0's engine serves a 512-token system prompt, then enough other prompts to push it out of
//     its GPU pool into its CPU tier. The router's directory then reports node-0's CPU holding it.
//   - A request with that system prompt through the router's front door goes to node-0 over the
//     idle, cold node-1; the response says the estimate per tier (X-Prefixmesh-Estimated-Tiers
//     with cpu), and the estimate equals the engine's own cached_tokens (GPU + CPU-loaded, as
//     vLLM counts them). The router's per-tier counter counts the CPU tokens.
//   - After node-0's GPU forgets it again and node-1 serves it on its GPU, the directory answers
//     for the prompt held on two nodes in two tiers; each node's longest match is checked against
//     what its engine then reports as cached for the same prompt.
func TestTierCreditEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 2-node cluster")
	}
	cfg := defaultDemoConfig()
	cfg.Nodes = 2
	cfg.KVBlocks = 48 // 768 tokens: a 512-token prompt plus one filler do not fit together
	cfg.CPUBlocks = 1024
	cfg.PrefillPerSec = 400000
	cfg.DecodePerSec = 4000
	ctx, cl := startE2ECluster(t, cfg)
	const bs = 16
	system := seqIDs(512, 1000)
	prompt := func(q uint32) []uint32 { return append(append([]uint32(nil), system...), seqIDs(10, q)...) }
	node0, node1 := cl.nodes[0].engineHTTP, cl.nodes[1].engineHTTP
	router := cl.httpAddr

	// 1. The system prompt on node-0, then pushed from its GPU to its CPU by two fillers.
	complete(t, ctx, node0, prompt(1))
	complete(t, ctx, node0, seqIDs(640, 50000))
	complete(t, ctx, node0, seqIDs(640, 60000))
	waitDirectory(t, ctx, cl, prompt(2), func(m map[string]dirMatch) bool {
		return m["node-0"].CPU >= 512 && m["node-0"].GPU < 512 && m["node-1"].Longest == 0
	})

	// 2. Routed through the front door: node-0, credited by its CPU tier, estimate = cached_tokens.
	// A dry run first shows the choice is the credit's, not a tie-break: node-0's cost is lower.
	cc, err := grpc.NewClient(cl.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	rr, err := pb.NewRouterClient(cc).Route(ctx, &pb.RouteRequest{Tokens: prompt(3), Model: "prefixmesh-sim", DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	scores := map[string]float64{}
	for _, c := range rr.GetCandidates() {
		scores[c.GetNodeId()] = c.GetScore()
	}
	if !(scores["node-0"] < scores["node-1"]) {
		t.Fatalf("costs %v: the CPU tier's prefix must make node-0 cheaper than the cold node", scores)
	}
	resp := complete(t, ctx, router, prompt(3))
	t.Logf("routed: %+v", resp)
	if resp.node != "node-0" {
		t.Fatalf("routed to %q, want node-0, whose CPU holds the prefix (node-1 is idle and cold)", resp.node)
	}
	if !strings.Contains(resp.tiers, "cpu=") {
		t.Fatalf("X-Prefixmesh-Estimated-Tiers %q: want the CPU tier's share", resp.tiers)
	}
	if resp.estimate != resp.cached || resp.cached < 512 {
		t.Fatalf("estimate %d, engine's cached_tokens %d: want them equal and the system prompt's 512 at least", resp.estimate, resp.cached)
	}
	if v := metricValue(t, ctx, "http://"+router+"/metrics", `prefixmesh_router_decided_tier_tokens_total{tier="cpu"}`); v < 512 {
		t.Fatalf("decided CPU tier tokens %v, want at least 512", v)
	}

	// 3. Two nodes, two tiers: node-0's GPU forgets the prompt again (its CPU keeps it) and
	// node-1 serves it on its GPU.
	complete(t, ctx, node0, seqIDs(640, 70000))
	complete(t, ctx, node0, seqIDs(640, 80000))
	complete(t, ctx, node1, prompt(4))
	q := prompt(5)
	var got map[string]dirMatch
	waitDirectory(t, ctx, cl, q, func(m map[string]dirMatch) bool {
		got = m
		return m["node-0"].CPU >= 512 && m["node-0"].GPU < 512 && m["node-1"].GPU >= 512
	})
	t.Logf("directory: %+v", got)
	// The engines' own answers for the same prompt: what each loads and reuses.
	for i, n := range []string{node0, node1} {
		id := cl.nodes[i].id
		want := local.EngineCachedTokens(got[id].Longest, len(q), bs)
		if r := complete(t, ctx, n, q); r.cached != want {
			t.Errorf("%s: directory's longest match %d (engine rule: %d), engine reports cached_tokens %d", id, got[id].Longest, want, r.cached)
		}
	}
}

func seqIDs(n int, base uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = base + uint32(i)
	}
	return out
}

type completion struct {
	node, tiers      string
	estimate, cached int
}

// complete posts a one-token completion of ids to addr (an engine or the router) and returns the
// routing headers and the engine's cached_tokens.
func complete(t *testing.T, ctx context.Context, addr string, ids []uint32) completion {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "prefixmesh-sim", "prompt": ids, "max_tokens": 1})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %d %s", addr, resp.StatusCode, b)
	}
	var out struct {
		Usage struct {
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("%s: %v: %s", addr, err, b)
	}
	est, _ := strconv.Atoi(resp.Header.Get("X-Prefixmesh-Estimated-Tokens"))
	return completion{node: resp.Header.Get("X-Prefixmesh-Node"), tiers: resp.Header.Get("X-Prefixmesh-Estimated-Tiers"),
		estimate: est, cached: out.Usage.Details.Cached}
}

type dirMatch struct {
	Longest int `json:"longest_matched"`
	GPU     int `json:"GPU"`
	CPU     int `json:"CPU"`
	Disk    int `json:"DISK"`
}

// waitDirectory asks the router's directory for ids until cond holds, within a deadline.
func waitDirectory(t *testing.T, ctx context.Context, cl *demoCluster, ids []uint32, cond func(map[string]dirMatch) bool) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "prefixmesh-sim", "token_ids": ids, "block_size": 16})
	var last string
	err := pollUntil(ctx, time.Minute, cl, func() bool {
		resp, err := http.Post("http://"+cl.httpAddr+"/query", "application/json", bytes.NewReader(body))
		if err != nil {
			last = err.Error()
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		last = fmt.Sprintf("%d %s", resp.StatusCode, b)
		var out map[string]map[string]dirMatch
		if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &out) != nil {
			return false
		}
		return cond(out["default"])
	})
	if err != nil {
		t.Fatalf("directory never agreed: %v; last answer %s", err, last)
	}
}

// metricValue reads one sample (name with its labels, as exposed) from a /metrics page.
func metricValue(t *testing.T, ctx context.Context, url, sample string) float64 {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, sample+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	t.Fatalf("%s not on %s", sample, url)
	return 0
}
