package simengine

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prefixmesh/prefixmesh/node/kvevents"
)

// The engine's published KV events, mirrored by the node agent's real follower over ZMQ, give
// exactly the engine's own tree: after a mixed workload with shared prefixes, adapters,
// concurrency and eviction pressure, the mirror's summary equals the tree's, and so does every
// prompt's peek. Both layouts and both hash formats, with and without replay.
func TestKVEventsMirrorEqualsTree(t *testing.T) {
	for _, c := range []struct {
		layout kvevents.Layout
		hashes kvevents.HashFormat
		replay bool
	}{
		{kvevents.LayoutArray, kvevents.HashInt, true},
		{kvevents.LayoutMap, kvevents.HashBytes, true},
	} {
		t.Run(fmt.Sprintf("layout%d_hashes%d_replay%v", c.layout, c.hashes, c.replay), func(t *testing.T) {
			cfg := fastConfig()
			cfg.KVBlocks = 256 // pressure: the workload needs several times this
			cfg.KVEvents.Endpoint = "tcp://127.0.0.1:0"
			if c.replay {
				cfg.KVEvents.Replay = "tcp://127.0.0.1:0"
			}
			cfg.KVEvents.Layout, cfg.KVEvents.Hashes = c.layout, c.hashes
			te := startEngine(t, cfg)

			mir := kvevents.NewCacheMirror(cfg.BlockSize)
			fc := kvevents.DefaultConfig()
			fc.Endpoint, fc.Replay = te.KVEventsAddr(), te.KVEventsReplayAddr()
			f, err := kvevents.NewFollower(fc, mir, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			f.Start(ctx)
			defer f.Close()

			rng := rand.New(rand.NewPCG(5, 6))
			bases := make([][]int, 6)
			for i := range bases {
				bases[i] = make([]int, 64+rng.IntN(200))
				for j := range bases[i] {
					bases[i][j] = rng.IntN(5000)
				}
			}
			prompt := func(r *rand.Rand) ([]int, int) {
				b := bases[r.IntN(len(bases))]
				p := append([]int(nil), b[:16+r.IntN(len(b)-16)]...)
				for k := r.IntN(40); k > 0; k-- {
					p = append(p, r.IntN(5000))
				}
				return p, r.IntN(3) // adapter 0, 1 or 2
			}
			send := func(p []int, adapter int) {
				resp, b := te.post(t, "/v1/completions", map[string]any{"prompt": p, "max_tokens": 2, "adapter_id": adapter})
				if resp.StatusCode != 200 {
					t.Errorf("%d %s", resp.StatusCode, b)
				}
			}
			// The SUB may join after the first batches: the follower replays them from seq 0.
			for i := 0; i < 40; i++ {
				send(prompt(rng))
			}
			var wg sync.WaitGroup
			for w := 0; w < 4; w++ {
				r := rand.New(rand.NewPCG(uint64(w), 7))
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < 60; i++ {
						send(prompt(r))
					}
				}()
			}
			wg.Wait()
			if st := te.PoolStats(); st.Evicted == 0 {
				t.Fatal("the workload did not evict: no BlockRemoved exercised")
			}
			want, _ := te.cache.SummarySnapshot(nil)
			slices.Sort(want)
			deadline := time.Now().Add(20 * time.Second)
			for {
				got, _ := mir.SummarySnapshot(nil)
				slices.Sort(got)
				if slices.Equal(got, want) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("mirror %d hashes, engine tree %d", len(got), len(want))
				}
				time.Sleep(5 * time.Millisecond)
			}
			if !f.Complete() {
				t.Fatal("mirror not complete")
			}
			for i := 0; i < 50; i++ {
				p, a := prompt(rng)
				toks := make([]uint32, len(p))
				for j, v := range p {
					toks[j] = uint32(v)
				}
				if g, w := mir.PeekMatchedTokens(toks, cfg.BlockSize, uint64(a)), te.cache.PeekMatchedTokens(toks, cfg.BlockSize, uint64(a)); g != w {
					t.Fatalf("peek: mirror %d, engine %d", g, w)
				}
			}
		})
	}
}
