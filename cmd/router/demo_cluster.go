package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/prefixmesh/prefixmesh/internal/addrfile"
	"github.com/prefixmesh/prefixmesh/node/agentd"
	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
	"github.com/prefixmesh/prefixmesh/router/routerd"
)

// demoStartTimeout bounds how long a demo cluster may take to form (gossip join, first summary
// sync of every node, Raft election).
const demoStartTimeout = 60 * time.Second

// demoCluster is one router and its node agents, each running the daemons' own code (routerd,
// agentd) in this process, on loopback with OS-chosen ports.
type demoCluster struct {
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	mu       sync.Mutex // guards failure
	failure  error
	httpAddr string
	grpcAddr string
	eppAddr  string     // the endpoint picker's (ext_proc) address, with demoConfig.Gateway
	nodes    []demoNode // filled once every node agent has written its addresses
}

// demoNode is one node's pair of daemons: the engine and the agent mirroring it.
type demoNode struct {
	id                    string
	role                  string // the agent's --role
	agentGRPC, engineGRPC string
	engineHTTP            string
	agentHTTP             string
	// stopEngine stops this node's engine alone (its agent keeps gossiping the node), as a
	// crashed engine looks to the router.
	stopEngine context.CancelFunc
}

func startDemoCluster(parent context.Context, cfg demoConfig, policy, dir string, logs io.Writer) (*demoCluster, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(parent)
	c := &demoCluster{cancel: cancel}
	logs = &lockedWriter{w: logs}
	routerAddrs := filepath.Join(dir, "router.addr")
	routerArgs := []string{
		"--node-id=router-" + policy, "--policy=" + policy, "--log-level=warn",
		"--grpc-listen=127.0.0.1:0", "--http-listen=127.0.0.1:0", "--gossip-listen=127.0.0.1:0",
		// Loopback only, one process: the demo skips the gossip key a real cluster must have.
		"--insecure-gossip",
		"--raft-listen=127.0.0.1:0", "--raft-dir=" + filepath.Join(dir, "raft"),
		"--drain-timeout=5s", "--addr-file=" + routerAddrs,
	}
	if cfg.Gateway {
		routerArgs = append(routerArgs, "--ext-proc-listen=127.0.0.1:0")
	}
	if cfg.Disaggregate != "" {
		routerArgs = append(routerArgs, "--disaggregate="+cfg.Disaggregate)
	}
	c.run("router", func() int { return routerd.Main(ctx, routerArgs, io.Discard, logs) })
	addrs, err := waitAddrFile(ctx, routerAddrs, c)
	if err != nil {
		c.stop()
		return nil, err
	}
	c.httpAddr, c.grpcAddr, c.eppAddr = addrs["http"], addrs["grpc"], addrs["extproc"]
	// Each node is the production pair: an engine (the simulated engine, a faithful vLLM that
	// publishes its cache changes as vLLM KV events with replay, outside the cluster) and a node
	// agent in --engine vllm mode beside it that mirrors the engine's cache from those events and
	// gossips the mirror's summary to the router.
	for i := 0; i < cfg.Nodes; i++ {
		id, role := fmt.Sprintf("node-%d", i), cfg.role(i)
		engAddrs := filepath.Join(dir, id+"-engine.addr")
		engArgs := []string{
			"--node-id=" + id + "-engine", "--log-level=warn", "--engine=sim",
			"--grpc-listen=127.0.0.1:0", "--http-listen=127.0.0.1:0",
			"--sim-kv-events=tcp://127.0.0.1:0", "--sim-kv-events-replay=tcp://127.0.0.1:0",
			fmt.Sprintf("--block-size=%d", cfg.BlockSize), fmt.Sprintf("--kv-blocks=%d", cfg.KVBlocks),
			fmt.Sprintf("--sim-prefill-tokens-per-s=%g", cfg.PrefillPerSec),
			fmt.Sprintf("--sim-decode-tokens-per-s=%g", cfg.DecodePerSec),
			"--drain-timeout=5s", "--addr-file=" + engAddrs,
		}
		if cfg.CPUBlocks > 0 { // a CPU tier the GPU pool spills into, published as vLLM's CPU events
			engArgs = append(engArgs, fmt.Sprintf("--sim-cpu-blocks=%d", cfg.CPUBlocks))
		}
		if role != "both" {
			// A P/D node's engine is vLLM with NixlConnector: prefill legs leave their blocks
			// leased on a loopback side channel, decode legs pull from it at the transfer rate.
			engArgs = append(engArgs, "--sim-kv-side-channel=127.0.0.1:0",
				fmt.Sprintf("--sim-kv-transfer-tokens-per-s=%g", cfg.TransferPerSec))
		}
		n := demoNode{id: id, role: role}
		ectx, stop := context.WithCancel(ctx) // c.stop cancels ctx, so every path ends it
		n.stopEngine = stop
		c.run(id+"-engine", func() int { return agentd.Main(ectx, engArgs, io.Discard, logs) })
		eng, err := waitEngineAddrs(ctx, engAddrs, c, "http", "grpc", "kvevents", "kvevents_replay")
		if err != nil {
			c.stop()
			return nil, fmt.Errorf("%s engine: %w", id, err)
		}
		agentAddrs := filepath.Join(dir, id+".addr")
		agentArgs := []string{
			"--node-id=" + id, "--log-level=warn", "--engine=vllm", "--addr-file=" + agentAddrs,
			"--engine-url=http://" + eng["http"], "--kv-events=" + eng["kvevents"], "--kv-events-replay=" + eng["kvevents_replay"],
			"--grpc-listen=127.0.0.1:0", "--http-listen=127.0.0.1:0", "--gossip-listen=127.0.0.1:0",
			"--join=" + addrs["gossip"], "--insecure-gossip",
			fmt.Sprintf("--block-size=%d", cfg.BlockSize),
			"--drain-timeout=5s",
		}
		if role != "both" {
			agentArgs = append(agentArgs, "--role="+role, "--kv-connector=nixl")
		}
		c.run(id, func() int { return agentd.Main(ctx, agentArgs, io.Discard, logs) })
		ag, err := waitEngineAddrs(ctx, agentAddrs, c, "grpc", "http")
		if err != nil {
			c.stop()
			return nil, fmt.Errorf("%s: %w", id, err)
		}
		n.agentGRPC, n.agentHTTP, n.engineGRPC, n.engineHTTP = ag["grpc"], ag["http"], eng["grpc"], eng["http"]
		c.nodes = append(c.nodes, n)
	}
	// Route offers the nodes that take whole requests and decode legs; a prefill-only node is
	// waited for in the router's fleet metrics.
	routable := 0
	for _, n := range c.nodes {
		if n.role != "prefill" {
			routable++
		}
	}
	if err := c.waitNodes(ctx, routable); err != nil {
		c.stop()
		return nil, err
	}
	if routable < len(c.nodes) {
		if err := c.waitSynced(ctx, len(c.nodes)); err != nil {
			c.stop()
			return nil, err
		}
	}
	return c, nil
}

// run starts a daemon; a daemon that exits before stop is a failure the waits report.
func (c *demoCluster) run(name string, main func() int) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		if code := main(); code != 0 {
			c.mu.Lock()
			if c.failure == nil {
				c.failure = fmt.Errorf("%s exited with status %d (see the daemon log)", name, code)
			}
			c.mu.Unlock()
		}
	}()
}

func (c *demoCluster) failed() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.failure
}

// stop drains every daemon (their own drain deadlines bound it) and waits for them.
func (c *demoCluster) stop() {
	c.cancel()
	c.wg.Wait()
}

// waitNodes polls Router.Route until the router offers every node as a candidate.
func (c *demoCluster) waitNodes(ctx context.Context, want int) error {
	cc, err := grpc.NewClient(c.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	client := pb.NewRouterClient(cc)
	tokens := make([]uint32, 64)
	for i := range tokens {
		tokens[i] = uint32(i + 1)
	}
	have := 0
	err = pollUntil(ctx, demoStartTimeout, c, func() bool {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		resp, err := client.Route(rctx, &pb.RouteRequest{Tokens: tokens})
		if err != nil {
			return false
		}
		have = len(resp.GetCandidates())
		return have >= want
	})
	if err != nil {
		return fmt.Errorf("router sees %d of %d nodes: %w", have, want, err)
	}
	return nil
}

// waitSynced polls the router's /metrics until it holds a full summary of want nodes
// (prefixmesh_router_node_synced), the prefill-only ones included.
func (c *demoCluster) waitSynced(ctx context.Context, want int) error {
	have := 0
	err := pollUntil(ctx, demoStartTimeout, c, func() bool {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		fams, err := scrapeMetrics(rctx, http.DefaultClient, "http://"+c.httpAddr+"/metrics")
		if err != nil {
			return false
		}
		have = 0
		for _, m := range fams["prefixmesh_router_node_synced"].GetMetric() {
			if value(m) == 1 {
				have++
			}
		}
		return have >= want
	})
	if err != nil {
		return fmt.Errorf("router holds summaries of %d of %d nodes: %w", have, want, err)
	}
	return nil
}

// waitAddrFile waits for a daemon's "grpc=… http=… gossip=…" file and parses it.
func waitAddrFile(ctx context.Context, path string, c *demoCluster) (map[string]string, error) {
	var addrs map[string]string
	err := pollUntil(ctx, demoStartTimeout, c, func() bool {
		var err error
		addrs, err = addrfile.Read(path)
		if err != nil {
			return false
		}
		return addrs["http"] != "" && addrs["grpc"] != "" && addrs["gossip"] != ""
	})
	if err != nil {
		return nil, fmt.Errorf("router addresses: %w", err)
	}
	return addrs, nil
}

// waitEngineAddrs waits for a daemon's addr file to name every one of keys.
func waitEngineAddrs(ctx context.Context, path string, c *demoCluster, keys ...string) (map[string]string, error) {
	var addrs map[string]string
	err := pollUntil(ctx, demoStartTimeout, c, func() bool {
		var err error
		if addrs, err = addrfile.Read(path); err != nil {
			return false
		}
		for _, k := range keys {
			if addrs[k] == "" {
				return false
			}
		}
		return true
	})
	return addrs, err
}

// pollUntil checks cond every 50 ms until it holds, the timeout passes, ctx ends or a daemon of
// c fails.
func pollUntil(ctx context.Context, timeout time.Duration, c *demoCluster, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if cond() {
			return nil
		}
		if err := c.failed(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return errors.New("timed out")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// lockedWriter serialises the daemons' log writes into one file.
type lockedWriter struct {
	mu sync.Mutex // guards w
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
