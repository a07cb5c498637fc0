package routerd

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/prefixmesh/prefixmesh/node/agentd"
	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
)

// clusterWait bounds every wait of the cluster tests: start-up, gossip, Raft election, drain.
const clusterWait = 30 * time.Second

// lockedBuffer collects the daemons' logs for failure messages.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer // guarded by mu
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// harness runs daemons in process, each under its own context, and collects their logs. At
// cleanup it stops whatever still runs and checks that every daemon exited 0 within clusterWait.
type harness struct {
	t    *testing.T
	dir  string
	logs *lockedBuffer
	wg   sync.WaitGroup

	mu    sync.Mutex
	stops []func() // guarded by mu
	runs  int      // guarded by mu: numbers each run's addr file
}

func newHarness(t *testing.T) *harness {
	h := &harness{t: t, dir: t.TempDir(), logs: &lockedBuffer{}}
	t.Cleanup(func() {
		h.mu.Lock()
		stops := h.stops
		h.mu.Unlock()
		for _, stop := range stops { // in parallel: the daemons drain side by side
			go stop()
		}
		done := make(chan struct{})
		go func() { h.wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(clusterWait):
			t.Errorf("daemons still running %v after cancellation; logs:\n%s", clusterWait, h.logs)
		}
	})
	return h
}

// start runs main until stop, which cancels its context and waits for it to return (bounded by
// clusterWait); a non-zero exit fails the test.
func (h *harness) start(name string, main func(ctx context.Context) int) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan struct{})
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		defer close(exited)
		if code := main(ctx); code != 0 {
			h.t.Errorf("%s exited %d; logs:\n%s", name, code, h.logs)
		}
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case <-exited:
			case <-time.After(clusterWait):
				h.t.Errorf("%s still running %v after cancellation", name, clusterWait)
			}
		})
	}
	h.mu.Lock()
	h.stops = append(h.stops, stop)
	h.mu.Unlock()
	return stop
}

// router runs `serve` as id on 127.0.0.1:0 (Raft too, unless extra says otherwise) and returns
// its addresses once it listens.
func (h *harness) router(id string, extra ...string) (addrs map[string]string, stop func()) {
	h.mu.Lock()
	h.runs++
	addrFile := filepath.Join(h.dir, fmt.Sprintf("%s-%d.addrs", id, h.runs)) // a restart writes its own
	h.mu.Unlock()
	args := append([]string{"--node-id=" + id, "--log-level=warn", "--insecure-gossip",
		"--grpc-listen=127.0.0.1:0", "--http-listen=127.0.0.1:0", "--gossip-listen=127.0.0.1:0",
		"--raft-listen=127.0.0.1:0", "--raft-dir=" + filepath.Join(h.dir, id+"-raft"),
		"--tokenizer=cl100k_base", "--drain-timeout=5s", "--addr-file=" + addrFile}, extra...)
	stop = h.start(id, func(ctx context.Context) int { return Main(ctx, args, io.Discard, h.logs) })
	return waitAddrs(h.t, addrFile), stop
}

// node runs a simulated node agent joined to gossip seed; pinsAddr "" finds the Pins service
// through gossip.
func (h *harness) node(s nodeSpec, seed, pinsAddr string) map[string]string {
	addrFile := filepath.Join(h.dir, s.id+".addrs")
	args := []string{"--node-id=" + s.id, "--log-level=warn", "--engine=sim", "--insecure-gossip",
		"--grpc-listen=127.0.0.1:0", "--http-listen=127.0.0.1:0", "--gossip-listen=127.0.0.1:0",
		"--join=" + seed, "--block-size=16", fmt.Sprintf("--kv-blocks=%d", s.kvBlocks),
		"--sim-prefill-tokens-per-s=1e9", "--sim-decode-tokens-per-s=1e9",
		"--drain-timeout=5s", "--addr-file=" + addrFile}
	if pinsAddr != "" {
		args = append(args, "--pins-addr="+pinsAddr)
	}
	if s.decodePerSec > 0 {
		args = append(args, fmt.Sprintf("--sim-decode-tokens-per-s=%g", s.decodePerSec))
	}
	if s.tokenizer != "" {
		args = append(args, "--sim-tokenizer="+s.tokenizer)
	}
	h.start(s.id, func(ctx context.Context) int { return agentd.Main(ctx, args, io.Discard, h.logs) })
	return waitAddrs(h.t, addrFile)
}

// testCluster is one router (a single Raft voter) and simulated nodes, all in process on
// 127.0.0.1:0, joined by plaintext gossip.
type testCluster struct {
	*harness
	router     map[string]string // grpc, http, gossip, raft
	stopRouter func()
	nodes      map[string]map[string]string // node id → grpc, http
	cc         *grpc.ClientConn             // to the router
}

// nodeSpec is one simulated node: its id, KV pool size and whether it finds the router's Pins
// service through gossip (else --pins-addr).
type nodeSpec struct {
	id           string
	kvBlocks     int
	pinsByGossip bool
	decodePerSec float64 // 0: as fast as the simulator goes
	tokenizer    string  // --sim-tokenizer; "" for the default
}

// startCluster runs `serve` and the nodes; it returns once the router routes among all of them.
func startCluster(t *testing.T, specs []nodeSpec, routerFlags ...string) *testCluster {
	t.Helper()
	c := &testCluster{harness: newHarness(t), nodes: map[string]map[string]string{}}
	c.router, c.stopRouter = c.harness.router("router-0", routerFlags...)
	for _, s := range specs {
		pinsAddr := c.router["grpc"]
		if s.pinsByGossip {
			pinsAddr = ""
		}
		c.nodes[s.id] = c.node(s, c.router["gossip"], pinsAddr)
	}
	c.cc = dialT(t, c.router["grpc"])
	c.eventually("the router routes among every node", func() error {
		return routesAmong(c.cc, len(specs))
	})
	return c
}

// routesAmong checks that the router behind cc has n candidates for an unpinned prompt.
func routesAmong(cc *grpc.ClientConn, n int) error {
	resp, err := pb.NewRouterClient(cc).Route(context.Background(), &pb.RouteRequest{Tokens: []uint32{1, 2, 3}})
	if err != nil {
		return err
	}
	if len(resp.GetCandidates()) != n {
		return fmt.Errorf("%d candidates: %v", len(resp.GetCandidates()), resp.GetCandidates())
	}
	return nil
}

// eventually retries check every 10 ms until it returns nil, failing after clusterWait.
func (h *harness) eventually(what string, check func() error) {
	h.t.Helper()
	deadline := time.Now().Add(clusterWait)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("%s: not within %v: %v; logs:\n%s", what, clusterWait, err, h.logs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// completion is one answered generation request.
type completion struct {
	node      string // X-Prefixmesh-Node (empty when the request went to an engine directly)
	estimate  string // X-Prefixmesh-Estimated-Tokens
	cached    int    // usage.prompt_tokens_details.cached_tokens (non-streaming)
	body      string
	stream    bool
	sseEvents int
}

// post sends a completion request to base (the router's or an engine's HTTP address).
func post(t *testing.T, base string, body map[string]any) completion {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterWait)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+base+"/v1/completions", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", base, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("POST %s: read: %v", base, err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s %s: %d %s", base, b, resp.StatusCode, out)
	}
	c := completion{node: resp.Header.Get("X-Prefixmesh-Node"), estimate: resp.Header.Get("X-Prefixmesh-Estimated-Tokens"), body: string(out)}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		c.stream = true
		c.sseEvents = strings.Count(c.body, "data: ")
		return c
	}
	var u struct {
		Usage struct {
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(out, &u); err != nil {
		t.Fatalf("response %s: %v", out, err)
	}
	c.cached = u.Usage.Details.Cached
	return c
}

// prompt is n token ids starting at from: distinct prompts for distinct from.
func prompt(from, n int) []uint32 {
	p := make([]uint32, n)
	for i := range p {
		p[i] = uint32(from + i)
	}
	return p
}

// dialT connects to a gRPC address for the rest of the test.
func dialT(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}
