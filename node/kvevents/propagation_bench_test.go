package kvevents_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/prefixmesh/prefixmesh/cluster"
	"github.com/prefixmesh/prefixmesh/local"
	"github.com/prefixmesh/prefixmesh/node"
	"github.com/prefixmesh/prefixmesh/node/kvevents"
	"github.com/prefixmesh/prefixmesh/routing"
)

// BenchmarkPublishToRouters measures the time from an engine's publish of a BlockStored (an
// 8-block prompt) to both routers' indexes holding every block, at 16 nodes: each node is a
// vLLM-shaped publisher (the engine), a node agent's follower and mirror over ZMQ, and its
// gossip agent (production publish and load intervals) over real memberlist on loopback, with
// gRPC NodeCache for repairs. Reported: p50 and p99 in ms (ns/op is the mean).
func BenchmarkPublishToRouters(b *testing.B) {
	const nodes, bs = 16, 16
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	gossipCfg := func(role cluster.Role, id string) cluster.Config {
		c := cluster.DefaultConfig(role, id)
		c.BindAddr, c.BindPort, c.InsecureGossip, c.Profile = "127.0.0.1", 0, true, "local"
		return c
	}
	type router struct {
		agent *cluster.Agent
		idx   *routing.Index
	}
	var routers []router
	var seed []string
	for i := 0; i < 2; i++ {
		idx := routing.NewIndex(routing.DefaultIndexConfig())
		f := cluster.NewGRPCFetcher()
		defer f.Close()
		a, err := cluster.New(gossipCfg(cluster.RoleRouter, fmt.Sprintf("router-%d", i)), cluster.Deps{Index: idx, Fetcher: f})
		if err != nil {
			b.Fatal(err)
		}
		if err := a.Start(ctx); err != nil {
			b.Fatal(err)
		}
		defer a.Close(context.Background())
		if seed == nil {
			seed = []string{a.GossipAddr()}
		} else if _, err := a.Join(ctx, seed); err != nil {
			b.Fatal(err)
		}
		routers = append(routers, router{a, idx})
	}
	pubs := make([]*kvevents.Publisher, nodes)
	for i := range pubs {
		id := fmt.Sprintf("node-%d", i)
		pc := kvevents.DefaultPublisherConfig()
		pc.Endpoint, pc.Replay, pc.Layout = "tcp://127.0.0.1:0", "tcp://127.0.0.1:0", kvevents.LayoutMap
		p, err := kvevents.NewPublisher(ctx, pc, nil)
		if err != nil {
			b.Fatal(err)
		}
		defer p.Close()
		pubs[i] = p
		mir := kvevents.NewCacheMirror(bs)
		fc := kvevents.DefaultConfig()
		fc.Endpoint, fc.Replay = p.Addr(), p.ReplayAddr()
		f, err := kvevents.NewFollower(fc, mir, nil, nil)
		if err != nil {
			b.Fatal(err)
		}
		f.Start(ctx)
		defer f.Close()
		srv, err := node.New(mir, node.Config{NodeID: id, BlockSize: bs, ReadOnly: true})
		if err != nil {
			b.Fatal(err)
		}
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		gs := grpc.NewServer(srv.ServerOptions()...)
		srv.Register(gs)
		go func() { _ = gs.Serve(lis) }()
		defer gs.Stop()
		gc := gossipCfg(cluster.RoleNode, id)
		gc.Meta.GRPCAddr, gc.Meta.BlockSize, gc.Meta.Epoch, gc.Meta.Model = lis.Addr().String(), bs, srv.Epoch(), "m"
		a, err := cluster.New(gc, cluster.Deps{Source: mir})
		if err != nil {
			b.Fatal(err)
		}
		if err := a.Start(ctx); err != nil {
			b.Fatal(err)
		}
		defer a.Close(context.Background())
		if _, err := a.Join(ctx, seed); err != nil {
			b.Fatal(err)
		}
	}
	deadline := time.Now().Add(2 * time.Minute)
	for _, r := range routers {
		for len(r.agent.Mirror().Nodes()) < nodes || !r.agent.Mirror().Synced() {
			if time.Now().After(deadline) {
				b.Fatalf("routers did not sync with %d nodes", nodes)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	lat := make([]time.Duration, 0, b.N)
	blocks := make([]int, 1)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		k := rng.IntN(nodes)
		toks := make([]uint32, 8*bs)
		for j := range toks {
			toks[j] = uint32(i*1000 + j)
		}
		hashes := local.BlockHashes(toks, bs, 0)
		ev := kvevents.Event{Kind: kvevents.KindStored, BlockSize: bs, Tokens: toks}
		for j := range hashes {
			ev.Hashes = append(ev.Hashes, uint64(i)<<8|uint64(j)|1<<62) // opaque engine hashes
		}
		id := []string{fmt.Sprintf("node-%d", k)}
		start := time.Now()
		pubs[k].Publish(float64(start.UnixNano())/1e9, []kvevents.Event{ev})
		for _, r := range routers {
			for {
				r.idx.Estimate(hashes, id, blocks)
				if blocks[0] == len(hashes) {
					break
				}
				if time.Since(start) > time.Minute {
					b.Fatalf("publish %d never reached %s's index", i, id[0])
				}
				time.Sleep(50 * time.Microsecond)
			}
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}
