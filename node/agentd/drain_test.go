package agentd

import (
	"context"
	"testing"
	"time"

	"github.com/prefixmesh/prefixmesh/cluster"
	"github.com/prefixmesh/prefixmesh/routing"
)

// On shutdown the agent first gossips that it is draining, and a router sees the node as
// draining (left out of new decisions) while it is still a member, before it leaves.
func TestDrainAnnouncedBeforeLeaving(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	rc := cluster.DefaultConfig(cluster.RoleRouter, "router-0")
	rc.BindAddr, rc.BindPort, rc.InsecureGossip, rc.Profile = "127.0.0.1", 0, true, "local"
	fetch := cluster.NewGRPCFetcher()
	defer fetch.Close()
	router, err := cluster.New(rc, cluster.Deps{Index: routing.NewIndex(routing.DefaultIndexConfig()), Fetcher: fetch})
	if err != nil {
		t.Fatal(err)
	}
	if err := router.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer router.Close(context.Background())

	cfg := DefaultConfig()
	cfg.GRPCListen, cfg.HTTPListen, cfg.NodeID, cfg.KVBlocks = "127.0.0.1:0", "127.0.0.1:0", "gpu-0", 1024
	cfg.Gossip.Listen, cfg.Gossip.Insecure, cfg.Gossip.Join = "127.0.0.1:0", true, []string{router.GossipAddr()}
	// A notice far longer than gossip needs, so the router sees it whatever the machine's load.
	cfg.DrainTimeout, cfg.DrainNotice = 40*time.Second, 15*time.Second
	_, shutdown := runAgent(t, ctx, cfg)

	state := func() (member, draining bool) {
		for _, n := range router.Mirror().Nodes() {
			if n.Meta.NodeID == "gpu-0" {
				return true, n.Meta.Draining
			}
		}
		return false, false
	}
	waitFor(t, "the router sees gpu-0", func() bool { m, _ := state(); return m })
	if _, d := state(); d {
		t.Fatal("gpu-0 is draining before shutdown")
	}
	stopped := make(chan struct{})
	go func() { shutdown(); close(stopped) }()
	waitFor(t, "gpu-0 draining while still a member", func() bool { m, d := state(); return m && d })
	<-stopped
	waitFor(t, "gpu-0 gone after the notice", func() bool { m, _ := state(); return !m })
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
