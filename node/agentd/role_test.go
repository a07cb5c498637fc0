package agentd

import (
	"context"
	"strings"
	"testing"

	"github.com/prefixmesh/prefixmesh/cluster"
	"github.com/prefixmesh/prefixmesh/routing"
)

// A node's serving role and KV connector reach a router in its gossip metadata, and the agent
// says them on its own: in its start line and as prefixmesh_node_info on its /metrics.
func TestRoleGossipedAndShown(t *testing.T) {
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
	cfg.GRPCListen, cfg.HTTPListen, cfg.NodeID, cfg.KVBlocks = "127.0.0.1:0", "127.0.0.1:0", "gpu-p", 1024
	cfg.Gossip.Listen, cfg.Gossip.Insecure, cfg.Gossip.Join = "127.0.0.1:0", true, []string{router.GossipAddr()}
	cfg.Role, cfg.KVConnector, cfg.SGLangBootstrapPort = "prefill", "sglang", 9001
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	logs := newLogWatcher()
	done := make(chan error, 1)
	go func() { done <- Run(runCtx, cfg, logs) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	_, httpAddr := logs.waitAddrs(t)

	var seen cluster.Meta
	waitFor(t, "the router sees gpu-p", func() bool {
		for _, n := range router.Mirror().Nodes() {
			if n.Meta.NodeID == "gpu-p" {
				seen = n.Meta
				return true
			}
		}
		return false
	})
	if seen.Serving != cluster.ServePrefill || seen.KVConnector != cluster.KVConnectorSGLang || seen.BootstrapPort != 9001 {
		t.Fatalf("the router sees %+v, want prefill, sglang, port 9001", seen)
	}
	if !strings.Contains(logs.String(), `role=prefill kv_connector="sglang (bootstrap port 9001)"`) {
		t.Fatalf("the start line does not say the role; log:\n%s", logs)
	}
	if code, body := httpGet(t, ctx, "http://"+httpAddr+"/metrics"); code != 200 ||
		!strings.Contains(body, `prefixmesh_node_info{kv_connector="sglang",role="prefill"} 1`) {
		t.Fatalf("/metrics = %d without the node's info:\n%s", code, body)
	}
}
