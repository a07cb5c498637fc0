package agentd

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/prefixmesh/prefixmesh/internal/testenv"
	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
)

// TestAgentAgainstConformancePublisher runs the real node agent (agentd.Run, --engine vllm)
// against the Python conformance publisher written from the wire spec (node/kvevents/testdata),
// with a stub of the engine's HTTP API for health and the model: what the publisher stores
// becomes matchable through the agent's NodeCache, and a clear empties it.
func TestAgentAgainstConformancePublisher(t *testing.T) {
	if out, err := exec.Command("/usr/bin/python3", "-c", "import zmq, msgpack").CombinedOutput(); err != nil {
		testenv.Missing(t, "Debian's python3-zmq and python3-msgpack", fmt.Errorf("%v: %s", err, out), "apt-get install python3-zmq python3-msgpack (scripts/test.sh does in CI)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/usr/bin/python3", "../kvevents/testdata/conformance_pub.py",
		"--flavor", "vllm", "--layout", "map", "--hashes", "bytes", "--replay", "--replay-topic", "--block-size", "16")
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = in.Close(); _ = cmd.Wait() }()
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var hello struct{ Pub, Replay string }
	if !sc.Scan() || json.Unmarshal(sc.Bytes(), &hello) != nil {
		t.Fatalf("publisher: %q", sc.Text())
	}
	do := func(c string) {
		if _, err := fmt.Fprintln(in, c); err != nil {
			t.Fatal(err)
		}
		if !sc.Scan() {
			t.Fatal("publisher exited")
		}
	}
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
		case "/v1/models":
			fmt.Fprint(w, `{"object":"list","data":[{"id":"meta-llama/Llama-3.1-8B-Instruct","parent":null}]}`)
		default:
			http.NotFound(w, r)
		}
	}))
	defer engine.Close()

	cfg := DefaultConfig()
	cfg.GRPCListen, cfg.HTTPListen, cfg.NodeID = "127.0.0.1:0", "127.0.0.1:0", "gpu-0"
	cfg.Engine, cfg.EngineURL, cfg.Model = engineVLLM, engine.URL, ""
	cfg.KVEvents, cfg.KVEventsReplay = hello.Pub, hello.Replay
	addrs, _ := runAgent(t, ctx, cfg)
	conn := dial(t, addrs["grpc"])
	watchUntilServing(t, ctx, conn)
	c := pb.NewNodeCacheClient(conn)

	toks := make([]uint32, 40)
	js := "["
	for i := range toks {
		toks[i] = uint32(7000 + i)
		if i > 0 {
			js += ","
		}
		js += fmt.Sprint(toks[i])
	}
	js += "]"
	peek := func() int64 {
		r, err := c.PeekMatchedTokens(ctx, &pb.PeekMatchedTokensRequest{Tokens: toks, BlockSize: 16})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetMatchedTokens()
	}
	wait := func(what string, want int64) {
		deadline := time.Now().Add(testTimeout / 2)
		for peek() != want {
			if time.Now().After(deadline) {
				t.Fatalf("%s: peek %d, want %d", what, peek(), want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	do(`{"op":"store","tokens":` + js + `}`)
	wait("stored 40 tokens (2 full blocks)", 32)
	do(`{"op":"clear"}`)
	wait("cleared", 0)
}
