package agentd

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
)

// testTimeout bounds every wait in these tests: build, start-up, RPCs and shutdown.
const testTimeout = 60 * time.Second

// logWatcher is the daemon's stderr: it keeps everything for failure messages and reports the
// bound addresses from the "listening" line.
type logWatcher struct {
	mu    sync.Mutex
	buf   bytes.Buffer // guarded by mu
	addrs chan [2]string
	once  sync.Once
}

var listeningRE = regexp.MustCompile(`msg=listening grpc=(\S+) http=(\S+)`)

func newLogWatcher() *logWatcher { return &logWatcher{addrs: make(chan [2]string, 1)} }

// consume reads r line by line until EOF.
func (w *logWatcher) consume(r io.Reader) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		w.line(sc.Text())
	}
}

func (w *logWatcher) line(s string) {
	w.mu.Lock()
	w.buf.WriteString(s + "\n")
	w.mu.Unlock()
	if m := listeningRE.FindStringSubmatch(s); m != nil {
		w.once.Do(func() { w.addrs <- [2]string{m[1], m[2]} })
	}
}

// Write lets a logWatcher be run's stderr in process; slog writes whole lines.
func (w *logWatcher) Write(p []byte) (int, error) {
	for _, l := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		w.line(l)
	}
	return len(p), nil
}

func (w *logWatcher) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// waitAddrs returns the daemon's gRPC and HTTP addresses once it listens.
func (w *logWatcher) waitAddrs(t *testing.T) (grpcAddr, httpAddr string) {
	t.Helper()
	select {
	case a := <-w.addrs:
		return a[0], a[1]
	case <-time.After(testTimeout):
		t.Fatalf("no listening line within %v; log:\n%s", testTimeout, w)
		return "", ""
	}
}

// dial connects to the daemon's gRPC address.
func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// watchUntilServing opens a health Watch on the NodeCache service and returns the stream once it
// has reported SERVING.
func watchUntilServing(t *testing.T, ctx context.Context, conn *grpc.ClientConn) healthpb.Health_WatchClient {
	t.Helper()
	stream, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{Service: pb.NodeCache_ServiceDesc.ServiceName}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatalf("health Watch: %v", err)
	}
	for {
		r, err := stream.Recv()
		if err != nil {
			t.Fatalf("health Watch: %v before SERVING", err)
		}
		if r.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return stream
		}
	}
}

// expectDrained checks that a health watcher is told NOT_SERVING and its stream then ends.
func expectDrained(t *testing.T, stream healthpb.Health_WatchClient) {
	t.Helper()
	r, err := stream.Recv()
	if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health Watch after SIGTERM: %v, %v; want NOT_SERVING", r, err)
	}
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("health Watch after NOT_SERVING: %v, want end of stream", err)
	}
}

func httpGet(t *testing.T, ctx context.Context, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(body)
}

// TestDaemonProcess builds the real binary and runs it as a separate process: it listens on
// ephemeral ports, reports SERVING, serves NodeCache and /metrics, and on SIGTERM tells health
// watchers NOT_SERVING and exits 0 well within its drain timeout (an open Watch does not hold it).
func TestDaemonProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the daemon binary")
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	bin := filepath.Join(t.TempDir(), "prefixmesh-node")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/prefixmesh/prefixmesh/cmd/node").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	const drain = 30 * time.Second
	cmd := exec.Command(bin, "--grpc-listen=127.0.0.1:0", "--http-listen=127.0.0.1:0", "--engine=external",
		"--engine-url=http://127.0.0.1:9", "--node-id=proc-test", fmt.Sprintf("--drain-timeout=%v", drain))
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	logs := newLogWatcher()
	if err := cmd.Start(); err != nil {
		t.Fatalf("start: %v", err)
	}
	logged := make(chan struct{})
	go func() { logs.consume(stderr); close(logged) }()
	exited := make(chan error, 1)
	go func() { <-logged; exited <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-exited
		}
	})

	grpcAddr, httpAddr := logs.waitAddrs(t)
	conn := dial(t, grpcAddr)
	watch := watchUntilServing(t, ctx, conn)

	c := pb.NewNodeCacheClient(conn)
	tokens := make([]uint32, 40)
	for i := range tokens {
		tokens[i] = uint32(1000 + i)
	}
	acq, err := c.Insert(ctx, &pb.InsertRequest{Tokens: tokens, BlockTable: []uint32{1, 2, 3}, BlockSize: 16})
	if err != nil || len(acq.GetAcquired().GetBlocks()) != 3 {
		t.Fatalf("Insert = %v, %v; want 3 blocks acquired", acq, err)
	}
	m, err := c.Lookup(ctx, &pb.LookupRequest{Tokens: tokens, BlockSize: 16})
	if err != nil || m.GetMatch().GetMatchedTokens() != 32 {
		t.Fatalf("Lookup = %v, %v; want 32 tokens", m, err)
	}
	st, err := c.Stats(ctx, &pb.StatsRequest{})
	if err != nil || st.GetNodeId() != "proc-test" || st.GetCachedBlocks() != 2 || st.GetHits() != 1 {
		t.Fatalf("Stats = %v, %v; want node proc-test, 2 blocks, 1 hit", st, err)
	}
	if _, err := c.Lookup(ctx, &pb.LookupRequest{Tokens: tokens}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("Lookup without block_size: %v, want InvalidArgument", err)
	}
	if code, body := httpGet(t, ctx, "http://"+httpAddr+"/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz = %d %q", code, body)
	}
	_, metrics := httpGet(t, ctx, "http://"+httpAddr+"/metrics")
	for _, want := range []string{
		`prefixmesh_node_grpc_requests_total{code="OK",method="prefixmesh.v1.NodeCache/Insert"} 1`,
		`prefixmesh_node_grpc_requests_total{code="InvalidArgument",method="prefixmesh.v1.NodeCache/Lookup"} 1`,
		`prefixmesh_node_cache_hits_total 1`,
		`prefixmesh_node_cache_cached_blocks 2`,
		`go_goroutines`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}

	start := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	expectDrained(t, watch)
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v; log:\n%s", err, logs)
		}
	case <-ctx.Done():
		t.Fatalf("still running %v after SIGTERM; log:\n%s", time.Since(start), logs)
	}
	if took := time.Since(start); took >= drain {
		t.Fatalf("shutdown took %v, the whole drain timeout: something held GracefulStop", took)
	}
	if !strings.Contains(logs.String(), "msg=stopped") {
		t.Fatalf("no clean stop logged:\n%s", logs)
	}
}

// TestRunSimEngine runs the agent in process with the simulated engine: the OpenAI API answers on
// the HTTP listener, the engine's inserts are visible through NodeCache, remote writes are
// refused (the engine owns the tree), and cancelling the context drains and returns nil.
func TestRunSimEngine(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	cfg := DefaultConfig()
	cfg.GRPCListen = "unix://" + filepath.Join(t.TempDir(), "node.sock")
	cfg.HTTPListen = "127.0.0.1:0"
	cfg.NodeID = "sim-test"
	cfg.KVBlocks = 1024
	cfg.Sim.PrefillTokensPerSec = 1e9 // no simulated waiting in a test
	cfg.Sim.DecodeTokensPerSec = 1e9
	cfg.AddrFile = filepath.Join(t.TempDir(), "addrs")
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	logs := newLogWatcher()
	done := make(chan error, 1)
	go func() { done <- Run(runCtx, cfg, logs) }()

	grpcAddr, httpAddr := logs.waitAddrs(t)
	if got, err := os.ReadFile(cfg.AddrFile); err != nil || string(got) != fmt.Sprintf("grpc=%s http=%s\n", grpcAddr, httpAddr) {
		t.Fatalf("addr file = %q, %v", got, err)
	}
	conn := dial(t, grpcAddr)
	watch := watchUntilServing(t, ctx, conn)

	if code, body := httpGet(t, ctx, "http://"+httpAddr+"/v1/models"); code != http.StatusOK || !strings.Contains(body, "prefixmesh-sim") {
		t.Fatalf("/v1/models = %d %q", code, body)
	}
	prompt := make([]string, 48)
	for i := range prompt {
		prompt[i] = fmt.Sprint(500 + i)
	}
	body := `{"model":"prefixmesh-sim","max_tokens":2,"prompt":[` + strings.Join(prompt, ",") + `]}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+httpAddr+"/v1/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST /v1/completions: %v", err)
	}
	out, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /v1/completions = %d %s", resp.StatusCode, out)
	}

	c := pb.NewNodeCacheClient(conn)
	tokens := make([]uint32, 48)
	for i := range tokens {
		tokens[i] = uint32(500 + i)
	}
	if r, err := c.PeekMatchedTokens(ctx, &pb.PeekMatchedTokensRequest{Tokens: tokens, BlockSize: 16}); err != nil || r.GetMatchedTokens() != 48 {
		t.Fatalf("Peek after a completion = %v, %v; want the 48 prompt tokens cached", r, err)
	}
	if _, err := c.Insert(ctx, &pb.InsertRequest{Tokens: tokens, BlockTable: []uint32{1}, BlockSize: 16}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("remote Insert with --engine=sim: %v, want FailedPrecondition", err)
	}

	stop()
	expectDrained(t, watch)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run = %v", err)
		}
	case <-ctx.Done():
		t.Fatalf("run did not return after cancel; log:\n%s", logs)
	}
	if _, err := os.Stat(strings.TrimPrefix(cfg.GRPCListen, "unix://")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("unix socket left behind: %v", err)
	}
}
