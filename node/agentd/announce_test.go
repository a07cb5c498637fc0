package agentd

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/prefixmesh/prefixmesh/cluster"
	"github.com/prefixmesh/prefixmesh/local"
	"github.com/prefixmesh/prefixmesh/node/kvevents"
	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
	"github.com/prefixmesh/prefixmesh/routing"
)

// TestMirroredEngineEpochAndCold runs the real agent (Run, --engine vllm, binding its KV-event
// socket, no replay) in a gossip cluster with a real router agent (memberlist, index, gRPC
// repairs), and an engine publishing over ZMQ:
//   - joined late (the first batch is not seq 0) without replay, the node is partial: a lower
//     bound, credited at the router, not cold;
//   - a gap that cannot be replayed clears the mirror, which is rebuilt from the next batch on
//     (what was stored before the gap is gone at the router), still not cold;
//   - the engine restarts (its sequence starts over at 0): the node moves to a new epoch, the
//     same in its metadata, Stats and GetSummary, whose summary holds only the new engine's
//     blocks; the router drops the old ones as soon as it sees the new epoch (never crediting
//     them after) and holds only the new ones.
func TestMirroredEngineEpochAndCold(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	const bs = 16

	idx := routing.NewIndex(routing.DefaultIndexConfig())
	fetch := cluster.NewGRPCFetcher()
	defer fetch.Close()
	rc := cluster.DefaultConfig(cluster.RoleRouter, "router-0")
	rc.BindAddr, rc.BindPort, rc.InsecureGossip, rc.Profile = "127.0.0.1", 0, true, "local"
	router, err := cluster.New(rc, cluster.Deps{Index: idx, Fetcher: fetch})
	if err != nil {
		t.Fatal(err)
	}
	if err := router.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer router.Close(context.Background())

	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health" {
			http.NotFound(w, r)
		}
	}))
	defer engine.Close()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	events := "tcp://" + l.Addr().String()
	_ = l.Close()

	cfg := DefaultConfig()
	cfg.GRPCListen, cfg.HTTPListen, cfg.NodeID = "127.0.0.1:0", "127.0.0.1:0", "gpu-0"
	cfg.Engine, cfg.EngineURL, cfg.Model = engineVLLM, engine.URL, "m"
	cfg.KVEventsListen, cfg.KVEventsReplay = events, ""
	cfg.Gossip.Listen, cfg.Gossip.Insecure, cfg.Gossip.Join = "127.0.0.1:0", true, []string{router.GossipAddr()}
	addrs, _ := runAgent(t, ctx, cfg)
	conn := dial(t, addrs["grpc"])
	c := pb.NewNodeCacheClient(conn)

	pub := zmq4.NewPub(ctx)
	defer pub.Close()
	if err := pub.Dial(events); err != nil {
		t.Fatal(err)
	}
	enc := kvevents.NewEncoder(kvevents.LayoutMap, kvevents.HashInt)
	send := func(seq uint64, evs ...kvevents.Event) {
		var s8 [8]byte
		for i := range 8 {
			s8[i] = byte(seq >> (56 - 8*i))
		}
		if err := pub.SendMulti(zmq4.NewMsgFrom([]byte{}, s8[:], enc.Encode(float64(time.Now().UnixNano())/1e9, evs, 0))); err != nil {
			t.Fatal(err)
		}
	}
	prompt := func(base uint32) []uint32 {
		p := make([]uint32, 2*bs)
		for i := range p {
			p[i] = base + uint32(i)
		}
		return p
	}
	stored := func(p []uint32, h uint64) kvevents.Event {
		return kvevents.Event{Kind: kvevents.KindStored, Hashes: []uint64{h, h + 1}, Tokens: p, BlockSize: bs}
	}
	old, fresh := prompt(1000), prompt(5000)
	est := func(p []uint32) int {
		got := make([]int, 1)
		idx.Estimate(local.BlockHashes(p, bs, 0), []string{"gpu-0"}, got)
		return got[0] * bs
	}
	atRouter := func() (cluster.NodeStatus, bool) {
		for _, n := range router.Mirror().Nodes() {
			if n.Meta.NodeID == "gpu-0" {
				return n, true
			}
		}
		return cluster.NodeStatus{}, false
	}
	wait := func(what string, cond func() (bool, string)) {
		t.Helper()
		deadline := time.Now().Add(testTimeout / 2)
		for {
			ok, msg := cond()
			if ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %s", what, msg)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	coldAtRouter := func(want bool) func() (bool, string) {
		return func() (bool, string) {
			n, ok := atRouter()
			return ok && n.Synced && n.Meta.Cold == want, fmt.Sprintf("router sees %+v (known %v), want cold=%v", n.Meta, ok, want)
		}
	}

	// Joined late, no replay: partial, a lower bound of the engine's cache, so credited and
	// never cold. Until the subscription takes, batches are lost: send until one lands.
	seq := uint64(40)
	wait("a late batch mirrored", func() (bool, string) {
		seq++
		send(seq, stored(old, 100))
		return est(old) == 2*bs, fmt.Sprintf("router estimates %d", est(old))
	})
	wait("warm after a late start", coldAtRouter(false))
	if _, st := httpGet(t, ctx, "http://"+addrs["http"]+"/metrics"); !strings.Contains(st, `prefixmesh_kvevents_partial_total{rank="0",reason="late_join"} 1`) {
		t.Fatalf("no late_join partial counted:\n%s", st)
	}

	// A gap the engine cannot replay may have removed blocks: the mirror is cleared and rebuilt
	// from the batch after the gap, partial again, and still warm.
	mid := prompt(3000)
	seq++
	send(seq, stored(mid, 300))
	wait("mid mirrored", func() (bool, string) { return est(mid) == 2*bs, fmt.Sprintf("estimate %d", est(mid)) })
	seq += 3
	send(seq, stored(old, 100))
	wait("cleared by the gap, rebuilt after it", func() (bool, string) {
		n, ok := atRouter()
		return ok && !n.Meta.Cold && est(mid) == 0 && est(old) == 2*bs, fmt.Sprintf("cold %v, estimates %d %d", n.Meta.Cold, est(mid), est(old))
	})
	seq++
	send(seq, kvevents.Event{Kind: kvevents.KindCleared}, stored(old, 100))
	wait("warm after a clear", coldAtRouter(false))
	wait("old cache at the router", func() (bool, string) { return est(old) == 2*bs, fmt.Sprintf("estimate %d", est(old)) })
	n0, _ := atRouter()
	oldEpoch := n0.Meta.Epoch
	if st, err := c.Stats(ctx, &pb.StatsRequest{}); err != nil || st.GetEpoch() != oldEpoch {
		t.Fatalf("Stats %v, %v: want the gossiped epoch %#x", st, err, oldEpoch)
	}

	// The engine restarts: sequence 0 again, and nothing on the stream says the cache is gone.
	send(0, stored(fresh, 200))
	var newEpoch uint64
	wait("the router at the new epoch", func() (bool, string) {
		n, ok := atRouter()
		if !ok || n.Meta.Epoch == oldEpoch {
			return false, "router still at the old epoch"
		}
		newEpoch = n.Meta.Epoch
		if e := est(old); e != 0 { // seen the new epoch: the old cache is gone at once
			t.Fatalf("router credits %d tokens of the old epoch after seeing the new one", e)
		}
		if e, _, _, ok := idx.NodeState("gpu-0"); !ok || e != newEpoch || !n.Synced || n.Meta.Cold || est(fresh) != 2*bs {
			return false, fmt.Sprintf("index epoch %#x (ok=%v), synced %v, cold %v, new estimate %d", e, ok, n.Synced, n.Meta.Cold, est(fresh))
		}
		return true, ""
	})
	if st, err := c.Stats(ctx, &pb.StatsRequest{}); err != nil || st.GetEpoch() != newEpoch {
		t.Fatalf("Stats %v, %v: want the new epoch %#x", st, err, newEpoch)
	}
	stream, err := c.GetSummary(ctx, &pb.GetSummaryRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var hashes []uint64
	for {
		ch, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if ch.GetEpoch() != newEpoch {
			t.Fatalf("GetSummary chunk of epoch %#x, want %#x", ch.GetEpoch(), newEpoch)
		}
		hashes = append(hashes, ch.GetHashes()...)
		if ch.GetLast() {
			break
		}
	}
	want := local.BlockHashes(fresh, bs, 0)
	slices.Sort(hashes)
	slices.Sort(want)
	if !slices.Equal(hashes, want) {
		t.Fatalf("summary after the restart %x, want only the new engine's %x", hashes, want)
	}
}
