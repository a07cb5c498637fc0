package routerd

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"

	"google.golang.org/grpc"

	"github.com/prefixmesh/prefixmesh/local"
	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
	"github.com/prefixmesh/prefixmesh/routing"
)

// threeRouters runs three `serve` routers over real memberlist (router-0 the Raft voter, the
// others following its pin table) and three simulated nodes, and waits until every router
// routes among the three nodes.
func threeRouters(t *testing.T) (h *harness, routers []map[string]string, ccs []*grpc.ClientConn, nodes []string) {
	h = newHarness(t)
	for i := range 3 {
		var extra []string
		if i > 0 {
			extra = []string{"--raft-voter=false", "--join=" + routers[0]["gossip"]}
		}
		addrs, _ := h.router(fmt.Sprint("router-", i), extra...)
		routers = append(routers, addrs)
		ccs = append(ccs, dialT(t, addrs["grpc"]))
	}
	for i := range 3 {
		id := fmt.Sprint("node-", i)
		h.node(nodeSpec{id: id, kvBlocks: 4096}, routers[0]["gossip"], "")
		nodes = append(nodes, id)
	}
	for i, cc := range ccs {
		h.eventually(fmt.Sprint("router-", i, " routes among the three nodes"), func() error { return routesAmong(cc, 3) })
	}
	return h, routers, ccs, nodes
}

// postSession posts a token-id completion to a front door with an X-Session-ID (when not "")
// and returns the node that served it and the engine's cached_tokens.
func postSession(t *testing.T, base string, tokens []uint32, session string) (node string, cached int) {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"model": "prefixmesh-sim", "prompt": tokens, "max_tokens": 1})
	ctx, cancel := context.WithTimeout(context.Background(), clusterWait)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+base+"/v1/completions", bytes.NewReader(b))
	if err != nil {
		t.Error(err)
		return "", 0
	}
	req.Header.Set("Content-Type", "application/json")
	if session != "" {
		req.Header.Set("X-Session-ID", session)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("POST %s: %v", base, err)
		return "", 0
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Errorf("POST %s: %d %s", base, resp.StatusCode, out)
		return "", 0
	}
	var u struct {
		Usage struct {
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	_ = json.Unmarshal(out, &u)
	return resp.Header.Get("X-Prefixmesh-Node"), u.Usage.Details.Cached
}

// rendezvousOrder returns nodes by descending rendezvous weight of key: where a request with no
// cached prefix anywhere and equal loads goes.
func rendezvousOrder(key uint64, nodes []string) []string {
	out := append([]string(nil), nodes...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if routing.RendezvousWeight(key, out[j]) > routing.RendezvousWeight(key, out[i]) {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

// Three routers over real memberlist route as one (routing/POLICIES.md, "Many routers"):
//   - a decision made on one router is in the others' overlays: a prefix Route sent to a
//     session's node (not where the prefix's own hash would put it, and never sent to the node,
//     so no summary can tell) is expected there by the other routers;
//   - a burst of 30 requests sharing a new 4k-token prefix, spread over the three front doors,
//     lands on one node, where one router puts it, and all but the first find it cached;
//   - with the same view, the routers agree on every session, over gRPC and over HTTP.
func TestThreeRoutersRouteAsOne(t *testing.T) {
	h, routers, ccs, nodes := threeRouters(t)
	ctx := context.Background()

	// Decisions are shared. Q's own first block would go to byQ[0]; a session whose node is
	// another one moves it there on router-1, and router-0 must then expect Q on that node.
	q := prompt(500000, 256)
	byQ := rendezvousOrder(local.BlockHashes(q, 16, 0)[0], nodes)
	session := ""
	for i := 0; session == ""; i++ {
		s := fmt.Sprint("mover-", i)
		if rendezvousOrder(routing.SessionKey(s), nodes)[0] != byQ[0] {
			session = s
		}
	}
	moved, err := pb.NewRouterClient(ccs[1]).Route(ctx, &pb.RouteRequest{Tokens: q, SessionId: session})
	if err != nil || moved.GetNodeId() == byQ[0] || moved.GetReason() != routing.ReasonSession {
		t.Fatalf("router-1 Route with session %q: %v %v (Q alone goes to %s)", session, moved, err, byQ[0])
	}
	longer := append(append([]uint32(nil), q...), prompt(600000, 64)...)
	h.eventually("router-0 expects Q where router-1 sent it", func() error {
		// A dry run: the probe itself must not record a decision of router-0's own.
		r, err := pb.NewRouterClient(ccs[0]).Route(ctx, &pb.RouteRequest{Tokens: longer, DryRun: true})
		if err != nil {
			return err
		}
		if r.GetNodeId() != moved.GetNodeId() || r.GetEstimatedMatchedTokens() != 256 {
			return fmt.Errorf("router-0 chose %s with %d tokens expected, want %s with 256", r.GetNodeId(), r.GetEstimatedMatchedTokens(), moved.GetNodeId())
		}
		return nil
	})

	// A burst on a new 4k-token prefix, in rounds of three concurrent requests, one per door.
	prefix := prompt(1000000, 4096)
	want := rendezvousOrder(local.BlockHashes(prefix, 16, 0)[0], nodes)[0] // one router's choice: nothing cached, equal loads
	perNode := map[string]int{}
	hits := 0
	for round := range 10 {
		var wg sync.WaitGroup
		var mu sync.Mutex
		for door := range 3 {
			toks := append(append([]uint32(nil), prefix...), prompt(2000000+1000*(3*round+door), 32)...)
			wg.Add(1)
			go func() {
				defer wg.Done()
				node, cached := postSession(t, routers[door]["http"], toks, "")
				mu.Lock()
				defer mu.Unlock()
				perNode[node]++
				if cached >= 4096-16 {
					hits++
				}
			}()
		}
		wg.Wait()
	}
	if perNode[want] != 30 {
		t.Fatalf("burst of 30 over three doors landed %v; one router puts it all on %s", perNode, want)
	}
	if hits < 27 {
		t.Fatalf("only %d of 30 requests found the 4k prefix cached (%v)", hits, perNode)
	}

	// Sessions: every router, both doors, the same node. A new session's first request is decided
	// by load, so each one starts once the routers' views agree: nothing in flight anywhere as
	// each router sees it. A peer's load report is up to a share interval old, and a finished
	// request still counted there would make a router alone choose another node for the session.
	for s := range 20 {
		name := fmt.Sprint("conversation-", s)
		toks := prompt(3000000+100*s, 48)
		h.eventually(fmt.Sprint("the routers see no load before ", name), func() error { return allIdle(ccs, toks) })
		var got []string
		for _, cc := range ccs {
			r, err := pb.NewRouterClient(cc).Route(ctx, &pb.RouteRequest{Tokens: toks, SessionId: name})
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, r.GetNodeId())
		}
		for _, rt := range routers {
			node, _ := postSession(t, rt["http"], toks, name)
			got = append(got, node)
		}
		for _, g := range got {
			if g != got[0] {
				t.Fatalf("session %q: gRPC on three routers then HTTP on three doors chose %v", name, got)
			}
		}
	}
	t.Logf("burst: %v, %d of 30 cached; sessions agree on gRPC and HTTP across three routers", perNode, hits)
}

// allIdle is nil when every router, asked for a dry run of tokens, weighs every candidate at
// zero load: the views a new session's first decision is made from are the same on each.
func allIdle(ccs []*grpc.ClientConn, tokens []uint32) error {
	for i, cc := range ccs {
		r, err := pb.NewRouterClient(cc).Route(context.Background(), &pb.RouteRequest{Tokens: tokens, DryRun: true})
		if err != nil {
			return err
		}
		for _, c := range r.GetCandidates() {
			if c.GetLoad() != 0 {
				return fmt.Errorf("router-%d weighs %s at load %v", i, c.GetNodeId(), c.GetLoad())
			}
		}
	}
	return nil
}
