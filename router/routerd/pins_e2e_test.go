package routerd

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
)

// TestPinsEndToEnd is the pin table's acceptance test: one router (a single Raft voter) and four
// simulated nodes. Adapter 7 pinned to two nodes through the Pins API only ever lands on them,
// over HTTP (model "prefixmesh-sim:7" or adapter_id 7) and gRPC Route; a prefix pinned on a node
// survives eviction under pressure, and once unpinned it can be evicted.
func TestPinsEndToEnd(t *testing.T) {
	c := startCluster(t, []nodeSpec{
		{id: "node-0", kvBlocks: 1024},
		{id: "node-1", kvBlocks: 1024, pinsByGossip: true},
		{id: "node-2", kvBlocks: 1024, pinsByGossip: true},
		{id: "node-3", kvBlocks: 64}, // 1,024 tokens: easy to fill
	})
	ctx := context.Background()
	pinsc := pb.NewPinsClient(c.cc)
	route := pb.NewRouterClient(c.cc)
	for _, id := range []uint64{7, 9} {
		if _, err := pinsc.PutAdapter(ctx, &pb.PutAdapterRequest{Adapter: &pb.Adapter{Id: id, Name: fmt.Sprint("adapter-", id), BaseModel: "prefixmesh-sim"}}); err != nil {
			t.Fatalf("PutAdapter %d: %v", id, err)
		}
	}
	pinned := []string{"node-1", "node-2"}
	if _, err := pinsc.PinAdapter(ctx, &pb.PinAdapterRequest{AdapterId: 7, Nodes: pinned}); err != nil {
		t.Fatalf("PinAdapter: %v", err)
	}

	// Adapter 7 lands on its pinned nodes only: the router is the leader, so its local read
	// already holds the pin.
	seen := map[string]int{}
	for i := range 24 {
		body := map[string]any{"prompt": prompt(1000+100*i, 40), "max_tokens": 1}
		if i%2 == 0 {
			body["model"] = "prefixmesh-sim:7"
		} else {
			body["model"], body["adapter_id"] = "prefixmesh-sim", 7
		}
		got := post(t, c.router["http"], body)
		if !slices.Contains(pinned, got.node) {
			t.Fatalf("HTTP request %d for adapter 7 went to %q, want one of %v", i, got.node, pinned)
		}
		seen[got.node]++
		resp, err := route.Route(ctx, &pb.RouteRequest{Tokens: prompt(50000+100*i, 40), AdapterId: 7})
		if err != nil {
			t.Fatalf("Route %d: %v", i, err)
		}
		if !slices.Contains(pinned, resp.GetNodeId()) {
			t.Fatalf("Route %d for adapter 7 chose %q, want one of %v", i, resp.GetNodeId(), pinned)
		}
		for _, cand := range resp.GetCandidates() {
			if !slices.Contains(pinned, cand.GetNodeId()) {
				t.Fatalf("Route %d for adapter 7 considered %q", i, cand.GetNodeId())
			}
		}
	}
	t.Logf("adapter 7 over HTTP: %v", seen)
	// An unpinned adapter may go anywhere: every node is a candidate.
	for i := range 4 {
		got := post(t, c.router["http"], map[string]any{"model": "prefixmesh-sim:9", "prompt": prompt(70000+100*i, 40), "max_tokens": 1})
		if _, ok := c.nodes[got.node]; !ok {
			t.Fatalf("adapter 9 went to %q", got.node)
		}
		resp, err := route.Route(ctx, &pb.RouteRequest{Tokens: prompt(70000+100*i, 40), AdapterId: 9})
		if err != nil || len(resp.GetCandidates()) != 4 {
			t.Fatalf("Route for unpinned adapter 9: %v candidates, %v", resp.GetCandidates(), err)
		}
	}

	// A prefix pinned on node-3 stays cached under pressure.
	node3 := c.nodes["node-3"]
	cache := pb.NewNodeCacheClient(dialT(t, node3["grpc"]))
	prefix := prompt(200000, 70) // 4 full blocks and a partial one: 64 tokens can be cached
	const want = 64
	peek := func() int {
		r, err := cache.PeekMatchedTokens(ctx, &pb.PeekMatchedTokensRequest{Tokens: prefix, BlockSize: 16, AdapterId: 9})
		if err != nil {
			t.Fatalf("Peek: %v", err)
		}
		return int(r.GetMatchedTokens())
	}
	post(t, node3["http"], map[string]any{"model": "prefixmesh-sim:9", "prompt": prefix, "max_tokens": 1})
	if got := peek(); got != want {
		t.Fatalf("after serving the prefix, node-3 peeks %d tokens, want %d", got, want)
	}
	if _, err := pinsc.PinPrefix(ctx, &pb.SetPrefixPinRequest{AdapterId: 9, Tokens: prefix, Nodes: []string{"node-3"}}); err != nil {
		t.Fatalf("PinPrefix: %v", err)
	}
	c.eventually("node-3 holds the pinned prefix", func() error {
		return metricIs(node3["http"], "prefixmesh_node_prefix_pins_held", "1")
	})
	pressure := func(round int) {
		for i := range 12 { // 12 prompts of 10 blocks each: about twice the 64-block pool
			post(t, node3["http"], map[string]any{"model": "prefixmesh-sim:9", "prompt": prompt(300000+round*20000+1000*i, 160), "max_tokens": 1})
		}
	}
	pressure(0)
	if got := peek(); got != want {
		t.Fatalf("pinned prefix after pressure: node-3 peeks %d tokens, want %d", got, want)
	}

	// Unpinned, the prefix is an ordinary leaf again and pressure evicts it.
	if _, err := pinsc.UnpinPrefix(ctx, &pb.ClearPrefixPinRequest{AdapterId: 9, Tokens: prefix}); err != nil {
		t.Fatalf("UnpinPrefix: %v", err)
	}
	c.eventually("node-3 releases the unpinned prefix", func() error {
		return metricIs(node3["http"], "prefixmesh_node_prefix_pins_held", "0")
	})
	for round := 1; peek() == want; round++ {
		if round > 5 {
			t.Fatalf("unpinned prefix still cached after %d rounds of pressure", round-1)
		}
		pressure(round)
	}
}

// metricIs checks that a Prometheus text exposition at base/metrics has name with value.
func metricIs(base, name, value string) error {
	resp, err := http.Get("http://" + base + "/metrics")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			if v == value {
				return nil
			}
			return fmt.Errorf("%s = %s, want %s", name, v, value)
		}
	}
	return fmt.Errorf("no %s in /metrics", name)
}
