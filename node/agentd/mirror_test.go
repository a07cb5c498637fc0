package agentd

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/prefixmesh/prefixmesh/internal/addrfile"
	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
)

// runAgent runs an agent in process until the test ends and returns its addresses.
func runAgent(t *testing.T, ctx context.Context, cfg Config) (map[string]string, func()) {
	t.Helper()
	cfg.AddrFile = filepath.Join(t.TempDir(), "addrs")
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	logs := newLogWatcher()
	done := make(chan error, 1)
	go func() { done <- Run(runCtx, cfg, logs) }()
	logs.waitAddrs(t)
	addrs, err := addrfile.Read(cfg.AddrFile)
	if err != nil {
		t.Fatal(err)
	}
	var stopped bool
	shutdown := func() {
		if stopped {
			return
		}
		stopped = true
		stop()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run: %v; log:\n%s", err, logs)
			}
		case <-time.After(testTimeout):
			t.Errorf("run did not return; log:\n%s", logs)
		}
	}
	t.Cleanup(shutdown)
	return addrs, shutdown
}

// TestRunMirrorsEngine runs the production path on loopback: a simulated engine publishing vLLM
// KV events (with replay) and a second agent in --engine vllm mode beside it, which learns the
// model from /v1/models, follows the engine's health and mirrors its cache: after requests, its
// NodeCache summary equals the engine's own, and its peek equals the engine's cached prefix.
func TestRunMirrorsEngine(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()

	sim := DefaultConfig()
	sim.GRPCListen, sim.HTTPListen, sim.NodeID = "127.0.0.1:0", "127.0.0.1:0", "engine"
	sim.KVBlocks = 512
	sim.Sim.PrefillTokensPerSec, sim.Sim.DecodeTokensPerSec = 1e9, 1e9
	sim.Sim.KVEvents, sim.Sim.KVEventsReplay = "tcp://127.0.0.1:0", "tcp://127.0.0.1:0"
	simAddrs, stopSim := runAgent(t, ctx, sim)

	ag := DefaultConfig()
	ag.GRPCListen, ag.HTTPListen, ag.NodeID = "127.0.0.1:0", "127.0.0.1:0", "agent"
	ag.Engine, ag.EngineURL = engineVLLM, "http://"+simAddrs["http"]
	ag.KVEvents, ag.KVEventsReplay = simAddrs["kvevents"], simAddrs["kvevents_replay"]
	ag.Model = "" // from the engine
	agAddrs, _ := runAgent(t, ctx, ag)

	conn := dial(t, agAddrs["grpc"])
	watch := watchUntilServing(t, ctx, conn)
	engConn := dial(t, simAddrs["grpc"])

	send := func(tokens []int) {
		p := make([]string, len(tokens))
		for i, v := range tokens {
			p[i] = fmt.Sprint(v)
		}
		body := `{"max_tokens":2,"prompt":[` + strings.Join(p, ",") + `]}`
		resp, err := http.Post("http://"+simAddrs["http"]+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
	}
	var prompts [][]int
	for i := 0; i < 30; i++ {
		p := make([]int, 40+7*i)
		for j := range p {
			p[j] = 1000*(i%4) + j // four families of shared prefixes
		}
		prompts = append(prompts, p)
		send(p)
	}
	summary := func(c pb.NodeCacheClient) []uint64 {
		st, err := c.GetSummary(ctx, &pb.GetSummaryRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var hs []uint64
		for {
			ch, err := st.Recv()
			if err != nil {
				t.Fatal(err)
			}
			hs = append(hs, ch.GetHashes()...)
			if ch.GetLast() {
				break
			}
		}
		slices.Sort(hs)
		return hs
	}
	mc, ec := pb.NewNodeCacheClient(conn), pb.NewNodeCacheClient(engConn)
	want := summary(ec)
	deadline := time.Now().Add(testTimeout / 2)
	for got := summary(mc); !slices.Equal(got, want); got = summary(mc) {
		if time.Now().After(deadline) {
			t.Fatalf("mirror summary %d hashes, engine %d", len(got), len(want))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(want) == 0 {
		t.Fatal("the engine cached nothing")
	}
	for _, p := range prompts {
		toks := make([]uint32, len(p))
		for i, v := range p {
			toks[i] = uint32(v)
		}
		a, err := mc.PeekMatchedTokens(ctx, &pb.PeekMatchedTokensRequest{Tokens: toks, BlockSize: 16})
		if err != nil {
			t.Fatal(err)
		}
		b, err := ec.PeekMatchedTokens(ctx, &pb.PeekMatchedTokensRequest{Tokens: toks, BlockSize: 16})
		if err != nil {
			t.Fatal(err)
		}
		if a.GetMatchedTokens() != b.GetMatchedTokens() {
			t.Fatalf("peek: mirror %d, engine %d", a.GetMatchedTokens(), b.GetMatchedTokens())
		}
	}

	// The engine goes away: the agent follows it to NOT_SERVING.
	stopSim()
	for {
		r, err := watch.Recv()
		if err != nil {
			t.Fatalf("health watch: %v", err)
		}
		if r.GetStatus() == healthpb.HealthCheckResponse_NOT_SERVING {
			break
		}
	}
}

// With --state-dir a stopped agent leaves a checkpoint, and the next one starts from it: the
// engine's cache before the restart is matched at once (the gap since replayed from the
// engine's replay socket), including a prefix the engine never stores again.
func TestRunRestoresMirrorFromStateDir(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	sim := DefaultConfig()
	sim.GRPCListen, sim.HTTPListen, sim.NodeID = "127.0.0.1:0", "127.0.0.1:0", "engine"
	sim.KVBlocks = 512
	sim.Sim.PrefillTokensPerSec, sim.Sim.DecodeTokensPerSec = 1e9, 1e9
	sim.Sim.KVEvents, sim.Sim.KVEventsReplay = "tcp://127.0.0.1:0", "tcp://127.0.0.1:0"
	simAddrs, _ := runAgent(t, ctx, sim)
	engConn := pb.NewNodeCacheClient(dial(t, simAddrs["grpc"]))

	ag := DefaultConfig()
	ag.GRPCListen, ag.HTTPListen, ag.NodeID = "127.0.0.1:0", "127.0.0.1:0", "agent"
	ag.Engine, ag.EngineURL, ag.Model = engineVLLM, "http://"+simAddrs["http"], "m"
	ag.KVEvents, ag.KVEventsReplay = simAddrs["kvevents"], simAddrs["kvevents_replay"]
	ag.StateDir = filepath.Join(t.TempDir(), "state")
	prompt := func(base uint32) []uint32 {
		p := make([]uint32, 100)
		for i := range p {
			p[i] = base + uint32(i)
		}
		return p
	}
	peek := func(c pb.NodeCacheClient, p []uint32) int {
		r, err := c.PeekMatchedTokens(ctx, &pb.PeekMatchedTokensRequest{Tokens: p, BlockSize: 16})
		if err != nil {
			t.Fatal(err)
		}
		return int(r.GetMatchedTokens())
	}
	waitSame := func(c pb.NodeCacheClient, p []uint32) {
		t.Helper()
		deadline := time.Now().Add(testTimeout / 4)
		for peek(c, p) != peek(engConn, p) || peek(c, p) == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("mirror %d, engine %d", peek(c, p), peek(engConn, p))
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	old, during := prompt(1000), prompt(9000)
	agAddrs, stop := runAgent(t, ctx, ag)
	complete(t, simAddrs["http"], old)
	waitSame(pb.NewNodeCacheClient(dial(t, agAddrs["grpc"])), old)
	stop()                                // writes the final checkpoint
	complete(t, simAddrs["http"], during) // while the agent is down: replayed after the restart

	agAddrs, _ = runAgent(t, ctx, ag)
	mc := pb.NewNodeCacheClient(dial(t, agAddrs["grpc"]))
	waitSame(mc, old)
	waitSame(mc, during)
	_, m := httpGet(t, ctx, "http://"+agAddrs["http"]+"/metrics")
	for _, want := range []string{`prefixmesh_kvevents_mirror_complete{rank="0"} 1`, `prefixmesh_kvevents_mirror_cold{rank="0"} 0`} {
		if !strings.Contains(m, want) {
			t.Fatalf("/metrics lacks %q", want)
		}
	}
}
