package routerd

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/prefixmesh/prefixmesh/cluster"
	"github.com/prefixmesh/prefixmesh/local"
	"github.com/prefixmesh/prefixmesh/node"
	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
)

func TestServeConfig(t *testing.T) {
	var out, errb bytes.Buffer
	if code := Main(context.Background(), []string{"--validate-only", "--insecure-gossip"}, &out, &errb); code != 0 || out.String() != "ok\n" {
		t.Fatalf("validate-only: code %d, %q %q", code, out.String(), errb.String())
	}
	out.Reset()
	if code := Main(context.Background(), []string{"--validate-only", "--insecure-gossip", "--join", "a:1", "--join", "b"}, &out, &errb); code != 0 {
		t.Fatalf("serve --validate-only: %d %s", code, errb.String())
	}
	for _, args := range [][]string{
		{"--validate-only"}, // no key, no --insecure-gossip
		{"--validate-only", "--insecure-gossip", "--policy", "nope"},
		{"--validate-only", "--insecure-gossip", "--grpc-listen", "nocolon"},
		{"--validate-only", "--insecure-gossip", "--log-level", "loud"},
		{"--validate-only", "--insecure-gossip", "extra"},
	} {
		errb.Reset()
		if code := Main(context.Background(), args, &out, &errb); code != 2 {
			t.Errorf("%v: code %d (%s)", args, code, errb.String())
		}
	}
}

// TestServeRoutesToTheNodeThatHoldsThePrefix runs `serve` in process with a real node agent
// (tree, NodeCache server, gossip) and checks health and Route end to end.
func TestServeRoutesToTheNodeThatHoldsThePrefix(t *testing.T) {
	dir := t.TempDir()
	addrFile := filepath.Join(dir, "addrs")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	var logs bytes.Buffer
	go func() {
		done <- Main(ctx, []string{"--grpc-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
			"--gossip-listen", "127.0.0.1:0", "--insecure-gossip", "--node-id", "router-0",
			"--raft-listen", "127.0.0.1:0", "--raft-dir", filepath.Join(dir, "raft"),
			"--tokenizer", "bytes", "--addr-file", addrFile, "--log-level", "error"}, &logs, &logs)
	}()
	defer func() {
		cancel()
		select {
		case code := <-done:
			if code != 0 {
				t.Errorf("serve exited %d: %s", code, logs.String())
			}
		case <-time.After(30 * time.Second):
			t.Error("serve did not stop within 30 s of cancellation")
		}
	}()
	addrs := waitAddrs(t, addrFile)

	// A node agent with a real tree and NodeCache server, joined to the router.
	tree := local.NewRadixTree(local.Options{})
	nodeAddr := startNodeCache(t, tree)
	gc := cluster.DefaultConfig(cluster.RoleNode, "node-7")
	gc.BindAddr, gc.BindPort, gc.InsecureGossip, gc.Profile = "127.0.0.1", 0, true, "local"
	gc.Meta.GRPCAddr, gc.Meta.BlockSize, gc.Meta.Epoch = nodeAddr, 16, nodeEpoch
	agent, err := cluster.New(gc, cluster.Deps{Source: tree})
	if err != nil {
		t.Fatal(err)
	}
	if err := agent.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer agent.Close(context.Background())
	if _, err := agent.Join(context.Background(), []string{addrs["gossip"]}); err != nil {
		t.Fatal(err)
	}

	cc, err := grpc.NewClient(addrs["grpc"], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	health := healthpb.NewHealthClient(cc)
	route := pb.NewRouterClient(cc)
	tokens := make([]uint32, 40)
	for i := range tokens {
		tokens[i] = uint32(i + 1)
	}
	tree.Insert(tokens, []uint32{1, 2, 3}, nil, 16, 0, 0)
	deadline := time.Now().Add(20 * time.Second)
	for {
		h, herr := health.Check(context.Background(), &healthpb.HealthCheckRequest{})
		resp, rerr := route.Route(context.Background(), &pb.RouteRequest{Tokens: tokens, DryRun: true}) // a probe: the estimate must come from node-7's summary
		if herr == nil && h.Status == healthpb.HealthCheckResponse_SERVING && rerr == nil &&
			resp.NodeId == "node-7" && resp.EstimatedMatchedTokens == 32 && resp.GrpcAddress == nodeAddr {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("route never named node-7 with 32 tokens: health %v %v, route %v %v", h, herr, resp, rerr)
		}
		time.Sleep(5 * time.Millisecond)
	}
	for path, want := range map[string]string{
		"/healthz": "ok",
		"/health":  "",
		"/metrics": "prefixmesh_index_pairs 2", // the two full blocks of node-7
	} {
		resp, err := http.Get("http://" + addrs["http"] + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
			t.Fatalf("GET %s: %d, no %q", path, resp.StatusCode, want)
		}
	}
}

// waitAddrs reads serve's addr file ("grpc=… http=… gossip=…") once it exists.
func waitAddrs(t *testing.T, path string) map[string]string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		b, err := os.ReadFile(path)
		if err == nil && strings.HasSuffix(string(b), "\n") {
			out := map[string]string{}
			for _, f := range strings.Fields(string(b)) {
				k, v, _ := strings.Cut(f, "=")
				out[k] = v
			}
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("no addr file: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

const nodeEpoch = 0x5eed

// startNodeCache serves tree's NodeCache on 127.0.0.1:0 and returns its address.
func startNodeCache(t *testing.T, tree *local.RadixTree) string {
	t.Helper()
	srv, err := node.New(tree, node.Config{NodeID: "node-7", BlockSize: 16, Epoch: nodeEpoch})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(srv.ServerOptions()...)
	srv.Register(g)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	return lis.Addr().String()
}
