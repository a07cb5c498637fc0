package routerd

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
)

// TestFrontDoorEndToEnd drives `serve`'s HTTP front door over four simulated nodes: /v1/models,
// a non-streaming and a streaming completion, and a repeated long prompt whose engine-reported
// cached_tokens equals the router's estimate (X-Prefixmesh-Estimated-Tokens).
func TestFrontDoorEndToEnd(t *testing.T) {
	c := startCluster(t, []nodeSpec{
		{id: "node-0", kvBlocks: 1024}, {id: "node-1", kvBlocks: 1024},
		{id: "node-2", kvBlocks: 1024}, {id: "node-3", kvBlocks: 1024},
	})
	base := c.router["http"]

	resp, err := http.Get("http://" + base + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var models struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	err = json.NewDecoder(resp.Body).Decode(&models)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || len(models.Data) != 1 || models.Data[0].ID != "prefixmesh-sim" {
		t.Fatalf("/v1/models = %d %+v, %v; want prefixmesh-sim", resp.StatusCode, models, err)
	}

	got := post(t, base, map[string]any{"model": "prefixmesh-sim", "prompt": "The quick brown fox jumps over the lazy dog", "max_tokens": 4})
	if _, ok := c.nodes[got.node]; !ok || !strings.Contains(got.body, `"choices"`) {
		t.Fatalf("non-streaming completion: node %q, body %s", got.node, got.body)
	}
	got = post(t, base, map[string]any{"model": "prefixmesh-sim", "prompt": "Stream me a story about caches", "max_tokens": 4, "stream": true})
	if !got.stream || got.sseEvents < 2 || !strings.HasSuffix(strings.TrimSpace(got.body), "data: [DONE]") {
		t.Fatalf("streaming completion: stream %v, %d events, body %q", got.stream, got.sseEvents, got.body)
	}

	// A long prompt, twice: the second time the router knows where it is cached (from the
	// node's summary, or its own in-flight overlay) and its estimate is what the engine reuses.
	long := prompt(10000, 300) // 18 full blocks: 288 tokens cacheable
	first := post(t, base, map[string]any{"model": "prefixmesh-sim", "prompt": long, "max_tokens": 2})
	if first.cached != 0 {
		t.Fatalf("first time, cached_tokens = %d, want 0", first.cached)
	}
	route := pb.NewRouterClient(c.cc)
	c.eventually("the first request's node reports the prompt in its summary", func() error {
		r, err := route.Route(context.Background(), &pb.RouteRequest{Tokens: long, DryRun: true})
		if err != nil {
			return err
		}
		if r.GetNodeId() != first.node || r.GetEstimatedMatchedTokens() != 288 {
			return fmt.Errorf("route: %s with %d tokens, want %s with 288", r.GetNodeId(), r.GetEstimatedMatchedTokens(), first.node)
		}
		return nil
	})
	second := post(t, base, map[string]any{"model": "prefixmesh-sim", "prompt": long, "max_tokens": 2})
	est, err := strconv.Atoi(second.estimate)
	if err != nil || second.node != first.node || est != 288 || second.cached != est {
		t.Fatalf("repeat: node %s (first %s), estimate %q, cached_tokens %d; want the same node, 288 and 288",
			second.node, first.node, second.estimate, second.cached)
	}

	// The router's own endpoints stay beside the front door. /healthz turns ok once the mirror
	// has synced every node (polled every 50 ms), which may be after the requests above: wait.
	for path, want := range map[string]string{"/healthz": "ok", "/metrics": "prefixmesh_pins"} {
		c.eventually("GET "+path, func() error {
			resp, err := http.Get("http://" + base + path)
			if err != nil {
				return err
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), want) {
				return fmt.Errorf("GET %s = %d, no %q", path, resp.StatusCode, want)
			}
			return nil
		})
	}
}
