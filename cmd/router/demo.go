package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/prefixmesh/prefixmesh/internal/loadgen"
	"github.com/prefixmesh/prefixmesh/routing/sim"
)

// demoConfig is `prefixmesh-router demo`. The defaults replay the Mooncake trace's last 160
// requests (where its prefix reuse is densest: half of their blocks repeat an earlier block of the
// slice, against 7% for the first 160) twice, about a minute in all on 2 cores, on engines four
// times faster than the simulator's standard node so that the slice's long prompts (23k tokens on
// average) keep a small cluster busy without queueing for minutes.
type demoConfig struct {
	Nodes           int
	Requests        int
	From            int // first trace row replayed; -1 means the last Requests rows
	Speed           float64
	Trace           string
	KVBlocks        int
	CPUBlocks       int // each engine's CPU tier in blocks (0: none)
	BlockSize       int
	PrefillPerSec   float64
	DecodePerSec    float64
	MaxOutputTokens int
	Policies        []string
	Quick           bool
	Serve           bool
	LogFile         string
	// Gateway also replays each policy through the fake gateway (router/extproc/fakegw), which
	// speaks ext_proc to the router's endpoint picker as Envoy does, on a fresh cluster of its own.
	Gateway bool
	// PD also replays the first policy on the same number of nodes split into prefill and decode
	// pools (pdRoles) and prints it beside that policy's aggregated run (demo_pd.go).
	PD bool
	// Roles is each node's --role (node i takes Roles[i]; past its end, both); a prefill or
	// decode node runs vLLM's NixlConnector (--kv-connector nixl, its engine's KV side channel on
	// loopback). Disaggregate is the router's --disaggregate ("": its default).
	Roles        []string
	Disaggregate string
	// TransferPerSec is the rate at which a decode engine pulls KV from a prefill engine: the
	// simulated engine's default (100,000 tok/s, a 100 Gb/s NIC for an 8B model).
	TransferPerSec float64
}

// role is node i's --role.
func (c demoConfig) role(i int) string {
	if i < len(c.Roles) && c.Roles[i] != "" {
		return c.Roles[i]
	}
	return "both"
}

func defaultDemoConfig() demoConfig {
	return demoConfig{
		Nodes:           4,
		Requests:        160,
		From:            -1,
		Speed:           2,
		Trace:           defaultTrace,
		KVBlocks:        16384,
		BlockSize:       16,
		PrefillPerSec:   40000,
		DecodePerSec:    400,
		MaxOutputTokens: 64,
		Policies:        []string{"prefixmesh", "round-robin"},
		Serve:           true,
		TransferPerSec:  100000,
	}
}

// quickCompress is how much faster --quick runs the clock. A shorter slice of the trace is not a
// smaller copy of the full run: the last 60 requests reuse fewer, longer prefixes, which
// round-robin's caches also catch after one miss per node (57.7% against 37.0% hit, 1.6×,
// where the full run shows 2.6×). So --quick replays the same requests and compresses time
// instead: arrivals, prefill and decode all quickCompress times faster. Every queue then evolves
// as in the full run, at a quarter of the time; hit ratios and the TTFT ratio compare with the
// full run's, absolute TTFTs are about a quarter of its. What does not compress (HTTP, KV-event
// and gossip propagation, the router's 50 ms summaries) is relatively 4× slower, which costs
// prefixmesh a little locality.
const quickCompress = 4

// quick makes the run a time-compressed copy of the full one that exits when done.
func (c *demoConfig) quick() {
	c.Speed *= quickCompress
	c.PrefillPerSec *= quickCompress
	c.DecodePerSec *= quickCompress
	c.TransferPerSec *= quickCompress
	c.Serve = false
}

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg := defaultDemoConfig()
	fs := flag.NewFlagSet("prefixmesh-router demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&cfg.Nodes, "nodes", cfg.Nodes, "node agents with simulated engines")
	fs.IntVar(&cfg.Requests, "requests", cfg.Requests, "trace requests to replay per policy")
	fs.IntVar(&cfg.From, "from", cfg.From, "first trace row to replay (-1: the last --requests rows)")
	fs.Float64Var(&cfg.Speed, "speed", cfg.Speed, "replay speed factor (2 = twice as fast as recorded)")
	fs.StringVar(&cfg.Trace, "trace", cfg.Trace, "Mooncake JSONL trace (a built-in synthetic trace is used when the file is absent)")
	fs.IntVar(&cfg.KVBlocks, "kv-blocks", cfg.KVBlocks, "KV blocks per simulated engine")
	fs.IntVar(&cfg.BlockSize, "block-size", cfg.BlockSize, "tokens per KV block")
	fs.Float64Var(&cfg.PrefillPerSec, "prefill-tokens-per-s", cfg.PrefillPerSec, "simulated prefill rate per node")
	fs.Float64Var(&cfg.DecodePerSec, "decode-tokens-per-s", cfg.DecodePerSec, "simulated decode rate per sequence")
	fs.IntVar(&cfg.MaxOutputTokens, "max-output-tokens", cfg.MaxOutputTokens, "cap on each request's output tokens")
	policies := fs.String("policies", strings.Join(cfg.Policies, ","), "policies to compare, each on a fresh cluster")
	quick := fs.Bool("quick", false, fmt.Sprintf("a short run that exits when done: the same requests with time compressed %d× (arrivals, prefill and decode rates)", quickCompress))
	fs.StringVar(&cfg.LogFile, "log-file", "", "daemon logs go here (default: a file in a temporary directory)")
	fs.BoolVar(&cfg.Gateway, "gateway", false, "also replay each policy through a fake inference gateway in front of the router's endpoint picker (Envoy ext_proc)")
	fs.BoolVar(&cfg.PD, "pd", false, "also replay the first policy on the same nodes split into prefill and decode pools (NIXL, --disaggregate "+pdDisaggregate+") and compare it with the aggregated run")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	cfg.Policies = strings.Split(*policies, ",")
	if *quick {
		cfg.Quick = true
		cfg.quick()
	}
	if cfg.Nodes < 1 || cfg.Requests < 1 || cfg.Speed <= 0 || cfg.KVBlocks < 1 || cfg.BlockSize < 1 || len(cfg.Policies) == 0 {
		fmt.Fprintln(stderr, "demo: --nodes, --requests, --speed, --kv-blocks and --block-size must be positive")
		return 2
	}
	if cfg.PD && cfg.Nodes < 2 {
		fmt.Fprintln(stderr, "demo: --pd needs --nodes 2 or more (a prefill pool and a decode pool)")
		return 2
	}
	if err := demo(ctx, cfg, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "demo: %v\n", err)
		return 1
	}
	return 0
}

func demo(ctx context.Context, cfg demoConfig, stdout, stderr io.Writer) error {
	started := time.Now()
	dir, err := os.MkdirTemp("", "prefixmesh-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if cfg.LogFile == "" {
		cfg.LogFile = filepath.Join(dir, "daemons.log")
	}
	logs, err := os.Create(cfg.LogFile)
	if err != nil {
		return err
	}
	defer logs.Close()
	reqs, source, err := demoRequests(cfg)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "prefixmesh demo: %d simulated engines (%d KV blocks of %d tokens, prefill %.0f tok/s) publishing vLLM KV events over ZMQ,\n"+
		"%d node agents in --engine vllm mode mirroring them, 1 router with Raft, real gossip, gRPC and HTTP on loopback\n",
		cfg.Nodes, cfg.KVBlocks, cfg.BlockSize, cfg.PrefillPerSec, cfg.Nodes)
	fmt.Fprintf(stdout, "replaying %d requests of %s at %gx speed through the HTTP front door, once per policy (daemon logs: %s)\n",
		len(reqs), source, cfg.Speed, cfg.LogFile)
	if cfg.Quick {
		fmt.Fprintf(stdout, "--quick: the full run's requests with time compressed %d× (arrivals, prefill and decode %d× faster): hit ratios and\n"+
			"the TTFT ratio compare with the full run's, TTFTs are about 1/%d of its\n", quickCompress, quickCompress, quickCompress)
	}
	fmt.Fprintln(stdout)

	if cfg.Gateway {
		fmt.Fprintf(stdout, "each policy is replayed twice, on fresh clusters: through the front door, and through a fake gateway that\n"+
			"asks the router's endpoint picker (ext_proc, FULL_DUPLEX_STREAMED) and forwards to the engine it names (\"/gw\" columns)\n\n")
	}
	if cfg.PD {
		fmt.Fprintf(stdout, "--pd: %s is replayed once more on the same %d nodes split into prefill and decode pools (vLLM NixlConnector\n"+
			"as the simulated engines play it, KV side channels on loopback), the router's front door driving both legs\n\n", cfg.Policies[0], cfg.Nodes)
	}
	var sums []loadgen.Summary
	var names []string
	var keep *demoCluster
	for i, policy := range cfg.Policies {
		for _, viaGateway := range []bool{false, true} {
			if viaGateway && !cfg.Gateway {
				continue
			}
			name, sub := policy, policy
			if viaGateway {
				name, sub = policy+"/gw", policy+"-gw"
			}
			launched := time.Now()
			c, err := startDemoCluster(ctx, cfg, policy, filepath.Join(dir, sub), logs)
			if err != nil {
				return fmt.Errorf("start cluster for %s: %w", name, err)
			}
			// From this cluster's launch to its router offering every node, not since the demo began.
			fmt.Fprintf(stdout, "[%s] cluster ready in %.1fs (router %s)\n", name, time.Since(launched).Seconds(), c.httpAddr)
			var s loadgen.Summary
			if viaGateway {
				s, err = replayGateway(ctx, cfg, c, name, reqs, stdout)
			} else {
				s, err = replay(ctx, cfg, c, name, "http://"+c.httpAddr, reqs, stdout)
			}
			if err != nil {
				c.stop()
				return err
			}
			sums, names = append(sums, s), append(names, name)
			if i == 0 && !viaGateway && cfg.Serve {
				keep = c // serve the first (default) policy's cluster afterwards
			} else {
				c.stop()
			}
		}
	}
	var pd loadgen.Summary
	var legs pdLegs
	if cfg.PD {
		if pd, legs, err = replayPD(ctx, cfg, cfg.Policies[0], dir, reqs, logs, stdout); err != nil {
			if keep != nil {
				keep.stop()
			}
			return err
		}
	}
	fmt.Fprintf(stdout, "\nresults (%d requests each, %.0fs in all)\n", len(reqs), time.Since(started).Seconds())
	loadgen.WriteTable(stdout, names, sums)
	fmt.Fprint(stdout, estimateNote)
	for i, s := range sums {
		if s.Errors > 0 {
			fmt.Fprintf(stdout, "%s: %d errors, first: %s\n", names[i], s.Errors, s.FirstErrorMessage)
		}
	}
	if cfg.PD {
		writePDTable(stdout, cfg.Policies[0], cfg.Nodes, sums[0], pd, legs)
		if pd.Errors > 0 {
			fmt.Fprintf(stdout, "%s/pd: %d errors, first: %s\n", cfg.Policies[0], pd.Errors, pd.FirstErrorMessage)
		}
	}
	if keep == nil {
		return nil
	}
	defer keep.stop()
	fmt.Fprintf(stdout, "\nThe %s router keeps serving at http://%s (Ctrl-C to stop). Try:\n", cfg.Policies[0], keep.httpAddr)
	fmt.Fprintf(stdout, "  curl -s http://%s/v1/models\n", keep.httpAddr)
	fmt.Fprintf(stdout, "  curl -sN http://%s/v1/chat/completions -H 'Content-Type: application/json' \\\n", keep.httpAddr)
	fmt.Fprintf(stdout, "    -d '{\"model\":\"prefixmesh-sim\",\"stream\":true,\"max_tokens\":16,\"messages\":[{\"role\":\"user\",\"content\":\"Hello!\"}]}'\n")
	fmt.Fprintf(stdout, "  grpcurl -plaintext %s list\n", keep.grpcAddr)
	<-ctx.Done()
	fmt.Fprintln(stdout, "stopping")
	return nil
}

// estimateNote explains the estimate rows under the table: a policy that seldom sends a request
// where its prefix is cached has mostly trivial estimates to get right.
const estimateNote = `estimate exact: the share of requests ("of N": those the engine reported cached_tokens for) whose router
estimate of reused tokens (X-Prefixmesh-Estimated-Tokens) equalled what the engine reported reusing. The router
estimates the node each policy chose. Round-robin's requests mostly land where nothing of theirs is cached:
estimated 0, found 0, trivially exact. prefixmesh sends most requests where their prefix is cached, or is being
prefilled by a request just before them, and an estimate made then can differ from what the engine finds when
the request arrives (a block evicted after its summary, or a prefill not finished yet). So prefixmesh's share can
be the lower of the two while its estimates matter far more; the MAE row says by how many tokens they miss.
`

// replay sends the requests to base (c's front door, or a gateway in front of it), printing
// progress every two seconds.
func replay(ctx context.Context, cfg demoConfig, c *demoCluster, policy, base string, reqs []loadgen.Request, stdout io.Writer) (loadgen.Summary, error) {
	var mu sync.Mutex // guards last and the progress line
	last := time.Now()
	begin := last
	lc := loadgen.Config{BaseURL: base, Model: "prefixmesh-sim", Concurrency: 64, Speed: cfg.Speed,
		Progress: func(done, total int) {
			mu.Lock()
			defer mu.Unlock()
			if time.Since(last) >= 2*time.Second || done == total {
				last = time.Now()
				fmt.Fprintf(stdout, "[%s] %d/%d requests done (%.0fs)\n", policy, done, total, time.Since(begin).Seconds())
			}
		}}
	res, err := loadgen.Run(ctx, lc, reqs)
	if err != nil {
		return loadgen.Summary{}, fmt.Errorf("replay with %s: %w", policy, err)
	}
	return loadgen.Summarize(res), nil
}

// demoRequests reads the trace slice, or builds a synthetic one when the file is absent.
func demoRequests(cfg demoConfig) ([]loadgen.Request, string, error) {
	opt := sim.DefaultReadOptions()
	if cfg.From >= 0 {
		opt.Limit = cfg.From + cfg.Requests
	}
	var tr *sim.Trace
	source := cfg.Trace
	path, err := findTrace(cfg.Trace)
	if err == nil {
		tr, err = readTrace(path, "mooncake", opt)
		if err != nil {
			return nil, "", err
		}
		if cfg.From < 0 {
			source = fmt.Sprintf("the last rows of %s", cfg.Trace)
		}
	} else {
		tr, err = sim.ReadAzure(strings.NewReader(syntheticAzureCSV(cfg.Requests)), opt)
		if err != nil {
			return nil, "", err
		}
		source = "a built-in synthetic trace (shared system prompts and multi-turn sessions)"
	}
	rows := tr.Requests
	if from := cfg.From; from >= 0 {
		rows = rows[min(from, len(rows)):]
	} else {
		rows = rows[max(0, len(rows)-cfg.Requests):]
	}
	rows = rows[:min(len(rows), cfg.Requests)]
	out := make([]loadgen.Request, 0, len(rows))
	for _, r := range rows {
		out = append(out, loadgen.Request{At: r.Arrival - rows[0].Arrival, Tokens: r.Tokens, MaxTokens: max(1, min(r.OutputTokens, cfg.MaxOutputTokens))})
	}
	return out, source, nil
}

// syntheticAzureCSV is an Azure-format trace of n requests, 4 per second, with prompt lengths
// cycling between 1k and 8k tokens; ReadAzure lays shared system prompts and sessions over it.
func syntheticAzureCSV(n int) string {
	var b strings.Builder
	b.WriteString("TIMESTAMP,ContextTokens,GeneratedTokens\n")
	t0 := time.Date(2023, 11, 16, 18, 0, 0, 0, time.UTC)
	for i := 0; i < n; i++ {
		at := t0.Add(time.Duration(i) * 250 * time.Millisecond)
		fmt.Fprintf(&b, "%s,%d,%d\n", at.Format("2006-01-02 15:04:05.0000000"), 1024+(i*2731)%7168, 16+(i*37)%128)
	}
	return b.String()
}
