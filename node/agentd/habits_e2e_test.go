package agentd

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prefixmesh/prefixmesh/internal/addrfile"
	"github.com/prefixmesh/prefixmesh/local"
	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
)

// TestMirrorPublisherHabitsRealProcesses runs two real prefixmesh-node processes per case: a
// simulated engine publishing KV events with one publisher's habits, and an agent in --engine
// vllm mode mirroring it. The habits: vLLM's (first sequence 0, "no parent" as nil, a replay
// socket) and those of emulators from the llm-d tooling (first sequence 1, "no parent" as 0, no
// replay: the agent's view is partial from the start), each in the map and the array layout.
// For every prompt sent twice, the agent's estimate for the repeat (its mirror's match, through
// vLLM's cached-tokens rule) equals the cached_tokens the engine reports for it, and the agent
// is never flagged cold.
func TestMirrorPublisherHabitsRealProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs real processes")
	}
	bin := buildNode(t)
	for _, c := range []struct {
		name  string
		sim   []string
		agent func(addrs map[string]string) []string
	}{
		{"vllm habits, map", []string{"--sim-kv-events-layout=map", "--sim-kv-events-replay=tcp://127.0.0.1:0"},
			func(a map[string]string) []string { return []string{"--kv-events-replay=" + a["kvevents_replay"]} }},
		{"vllm habits, array", []string{"--sim-kv-events-layout=array", "--sim-kv-events-replay=tcp://127.0.0.1:0"},
			func(a map[string]string) []string { return []string{"--kv-events-replay=" + a["kvevents_replay"]} }},
		{"llm-d habits, map", []string{"--sim-kv-events-layout=map", "--sim-kv-events-first-seq=1", "--sim-kv-events-parent-zero"},
			func(map[string]string) []string { return nil }},
		{"llm-d habits, array", []string{"--sim-kv-events-layout=array", "--sim-kv-events-first-seq=1", "--sim-kv-events-parent-zero"},
			func(map[string]string) []string { return nil }},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			defer cancel()
			simAddrs := startProc(t, ctx, bin, append([]string{"--node-id=engine", "--kv-blocks=4096",
				"--sim-prefill-tokens-per-s=1e9", "--sim-decode-tokens-per-s=1e9", "--sim-kv-events=tcp://127.0.0.1:0"}, c.sim...))
			agAddrs := startProc(t, ctx, bin, append([]string{"--node-id=agent", "--engine=vllm",
				"--engine-url=http://" + simAddrs["http"], "--kv-events=" + simAddrs["kvevents"]}, c.agent(simAddrs)...))
			mc := pb.NewNodeCacheClient(dial(t, agAddrs["grpc"]))
			ec := pb.NewNodeCacheClient(dial(t, simAddrs["grpc"]))
			peek := func(c pb.NodeCacheClient, toks []uint32) int {
				r, err := c.PeekMatchedTokens(ctx, &pb.PeekMatchedTokensRequest{Tokens: toks, BlockSize: 16})
				if err != nil {
					t.Fatal(err)
				}
				return int(r.GetMatchedTokens())
			}
			exact := 0
			for i := 0; i < 6; i++ {
				p := make([]uint32, 400+37*i)
				for j := range p {
					p[j] = uint32(5000*(i%3) + j) // three families of shared prefixes
				}
				complete(t, simAddrs["http"], p)
				// The mirror catches up with the engine's cache (the events are asynchronous).
				deadline := time.Now().Add(testTimeout / 4)
				for peek(mc, p) != peek(ec, p) {
					if time.Now().After(deadline) {
						t.Fatalf("prompt %d: mirror matches %d, the engine %d", i, peek(mc, p), peek(ec, p))
					}
					time.Sleep(5 * time.Millisecond)
				}
				estimate := local.EngineCachedTokens(peek(mc, p), len(p), 16)
				cached := complete(t, simAddrs["http"], p)
				if cached == 0 || estimate != cached {
					t.Fatalf("prompt %d (%d tokens): estimate %d, the engine reports cached_tokens %d", i, len(p), estimate, cached)
				}
				exact++
			}
			_, m := httpGet(t, ctx, "http://"+agAddrs["http"]+"/metrics")
			if !strings.Contains(m, `prefixmesh_kvevents_mirror_cold{rank="0"} 0`) {
				t.Fatalf("the agent is cold:\n%s", m)
			}
			t.Logf("%s: estimate == cached_tokens on %d of 6 repeated prompts", c.name, exact)
		})
	}
}

// buildNode builds prefixmesh-node into the test's temporary directory.
func buildNode(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "prefixmesh-node")
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	build := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", bin, "./cmd/node")
	build.Dir, build.Env = root, append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// startProc runs the node binary with args (on ephemeral loopback ports) until the test ends
// and returns its addresses.
func startProc(t *testing.T, ctx context.Context, bin string, args []string) map[string]string {
	t.Helper()
	a, _ := startProcCmd(t, ctx, bin, args)
	return a
}

// startProcCmd is startProc that also returns the process (to kill it).
func startProcCmd(t *testing.T, ctx context.Context, bin string, args []string) (map[string]string, *exec.Cmd) {
	t.Helper()
	af := filepath.Join(t.TempDir(), "addrs")
	cmd := exec.Command(bin, append([]string{"--grpc-listen=127.0.0.1:0", "--http-listen=127.0.0.1:0", "--addr-file=" + af}, args...)...)
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt) // a no-op when the test killed it
		select {
		case <-done:
		case <-time.After(testTimeout / 2):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("%s log:\n%s", filepath.Base(bin), logs.String())
		}
	})
	for {
		if a, err := addrfile.Read(af); err == nil && a["http"] != "" {
			return a, cmd
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%v never wrote its addresses", args)
		case <-done:
			t.Fatalf("%v exited: %s", args, logs.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// complete sends one completion for the token ids and returns usage.prompt_tokens_details.cached_tokens.
func complete(t *testing.T, addr string, toks []uint32) int {
	t.Helper()
	ids := make([]string, len(toks))
	for i, v := range toks {
		ids[i] = fmt.Sprint(v)
	}
	body := `{"max_tokens":1,"prompt":[` + strings.Join(ids, ",") + `]}`
	resp, err := http.Post("http://"+addr+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("completion: %d %s", resp.StatusCode, b)
	}
	var out struct {
		Usage struct {
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("completion: %v: %s", err, b)
	}
	return out.Usage.Details.Cached
}
