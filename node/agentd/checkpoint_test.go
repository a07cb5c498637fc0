package agentd

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prefixmesh/prefixmesh/node/kvevents"
	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
)

// An engine that restarted while the agent was down, seen only by its process start time (no
// replay socket, and its sequence happens to go on): the checkpoint records the start time, the
// restarted agent's first probe sees another one, and the restored mirror is dropped.
func TestRunDropsCheckpointOfRestartedEngine(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	var started, scrapes atomic.Int64
	started.Store(1000)
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
		case "/metrics":
			fmt.Fprintf(w, "process_start_time_seconds %d\n", started.Load())
			scrapes.Add(1)
		default:
			http.NotFound(w, r)
		}
	}))
	defer engine.Close()
	pc := kvevents.DefaultPublisherConfig()
	pc.Endpoint = "tcp://127.0.0.1:0"
	pub, err := kvevents.NewPublisher(ctx, pc, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()

	cfg := DefaultConfig()
	cfg.GRPCListen, cfg.HTTPListen, cfg.NodeID = "127.0.0.1:0", "127.0.0.1:0", "agent"
	cfg.Engine, cfg.EngineURL, cfg.Model = engineVLLM, engine.URL, "m"
	cfg.KVEvents, cfg.KVEventsReplay = pub.Addr(), ""
	cfg.StateDir = filepath.Join(t.TempDir(), "state")
	tokens := make([]uint32, 32)
	for i := range tokens {
		tokens[i] = uint32(7000 + i)
	}
	peek := func(c pb.NodeCacheClient) int {
		r, err := c.PeekMatchedTokens(ctx, &pb.PeekMatchedTokensRequest{Tokens: tokens, BlockSize: 16})
		if err != nil {
			t.Fatal(err)
		}
		return int(r.GetMatchedTokens())
	}
	addrs, stop := runAgent(t, ctx, cfg)
	c := pb.NewNodeCacheClient(dial(t, addrs["grpc"]))
	deadline := time.Now().Add(testTimeout / 4)
	for peek(c) != 32 { // until the subscription takes
		if time.Now().After(deadline) {
			t.Fatal("nothing mirrored")
		}
		pub.Publish(1, []kvevents.Event{{Kind: kvevents.KindStored, Hashes: []uint64{1, 2}, Tokens: tokens, BlockSize: 16}})
		time.Sleep(10 * time.Millisecond)
	}
	// Two scrapes answered: the first one's start time is recorded.
	for scrapes.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the agent never probed the engine's metrics")
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()

	started.Store(2000) // the engine restarted meanwhile
	addrs, _ = runAgent(t, ctx, cfg)
	c = pb.NewNodeCacheClient(dial(t, addrs["grpc"]))
	deadline = time.Now().Add(testTimeout / 4)
	for peek(c) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the restarted engine's old cache is still credited")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
