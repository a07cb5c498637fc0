package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"image"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/prefixmesh/prefixmesh/internal/plot"
	"github.com/prefixmesh/prefixmesh/routing"
	"github.com/prefixmesh/prefixmesh/routing/sim"
)

// defaultTrace is the standard trace, relative to the repository root (the traces ship in data/traces).
const defaultTrace = "data/traces/synthetic_trace.jsonl"

// A long run reports on stderr at most every progressEvery and every progressStep percent: often
// enough to show it is alive, rarely enough not to flood a log.
const (
	progressEvery = 2 * time.Second
	progressStep  = 5
)

// simFlags are the command's flags, mapped 1:1 onto sim.Config and sim.ReadOptions.
type simFlags struct {
	trace, format, policies, jsonOut, plotOut string
	routers, sharing                          string
	shareLoss                                 float64
	shareDelay, loadInterval, shareInterval   time.Duration
	nodes, blocks, blockSize, limit, maxConc  int
	cpuBlocks, cpuChunk                       int
	cpuLoad                                   float64
	parallel, systemPrompts, minLoadBound     int
	speed, loss, prefill, decode, sessions    float64
	loadFactor, missPenalty                   float64
	seed                                      uint64
	noStagger, spread                         bool
	slot                                      time.Duration
	nodeSpeeds                                string
	noLearn                                   bool
	delay, repairDelay, arrivalQuantum        time.Duration
	tokenBudget, prefillNodes, llmdNonCached  int
	disaggregate                              string
	kvRate                                    float64
	kvOverhead                                time.Duration
	peerPull                                  bool
	decodeStall                               float64
}

// simConfigJSON is the "config" object of --json: every input that shapes the numbers.
type simConfigJSON struct {
	Trace               string  `json:"trace"`
	Requests            int     `json:"requests"`
	Nodes               int     `json:"nodes"`
	KVBlocks            int     `json:"kv_blocks"`
	CPUBlocks           int     `json:"cpu_blocks"`
	CPUChunkBlocks      int     `json:"cpu_chunk_blocks"`
	CPULoadTokensPerSec float64 `json:"cpu_load_tokens_per_s"`
	BlockSize           int     `json:"block_size"`
	PrefillTokensPerSec float64 `json:"prefill_tokens_per_s"`
	DecodeTokensPerSec  float64 `json:"decode_tokens_per_s"`
	MaxConcurrent       int     `json:"max_concurrent"`
	TokenBudget         int     `json:"token_budget"`
	// Disaggregation: absent on an aggregated fleet.
	PrefillNodes           int       `json:"prefill_nodes,omitempty"`
	Disaggregate           []string  `json:"disaggregate,omitempty"`
	LLMDNonCachedTokens    int       `json:"llmd_non_cached_tokens,omitempty"`
	KVTransferTokensPerSec float64   `json:"kv_transfer_tokens_per_s,omitempty"`
	KVTransferOverheadS    float64   `json:"kv_transfer_overhead_s,omitempty"`
	DelayS                 float64   `json:"delay_s"`
	Loss                   float64   `json:"loss"`
	RepairDelayS           float64   `json:"repair_delay_s"`
	Speed                  float64   `json:"speed"`
	Limit                  int       `json:"limit"`
	Seed                   uint64    `json:"seed"`
	LoadFactor             float64   `json:"load_factor"`
	MinLoadBound           int       `json:"min_load_bound"`
	MissPenalty            float64   `json:"miss_penalty"`
	NodeSpeeds             []float64 `json:"node_speeds,omitempty"`
	NoTTFTLearning         bool      `json:"no_ttft_learning,omitempty"`
	Policies               []string  `json:"policies"`
	Routers                []int     `json:"routers"`
	Sharing                []bool    `json:"sharing"`
	LoadIntervalS          float64   `json:"load_interval_s"`
	ShareDelayS            float64   `json:"share_delay_s"`
	ShareLoss              float64   `json:"share_loss"`
	ShareIntervalS         float64   `json:"share_interval_s"`
	ArrivalQuantumS        float64   `json:"arrival_quantum_s"`
	BurstStagger           bool      `json:"burst_stagger"`
	BurstSpread            bool      `json:"burst_spread"`
	PeerPull               bool      `json:"peer_pull"`
	DecodeStall            float64   `json:"decode_stall,omitempty"`
}

// simReport is the --json document; the unexported fields feed the table.
type simReport struct {
	Policies  []sim.Result  `json:"policies"`
	Reference sim.Reference `json:"reference"`
	Config    simConfigJSON `json:"config"`
	trace     string
	cfg       sim.Config
	elapsed   time.Duration // wall time of the runs
}

// runSim is `router sim`: replay a trace through every routing policy on a simulated fleet and
// print one row per policy plus the pooled-LRU and infinite-cache references.
func runSim(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("router sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	def, rdef := sim.DefaultConfig(), sim.DefaultReadOptions()
	var f simFlags
	fs.StringVar(&f.trace, "trace", defaultTrace, "trace file: Mooncake JSONL (.jsonl) or Azure CSV (.csv); relative paths are tried from the working directory, then from the module root. "+
		"Or a generated agent fan-out, fork[:key=value,…] (forks, prefix, branches, suffix lo-hi, output lo-hi, root-output, lead, burst, gap, seed; routing/sim/fork.go)")
	fs.StringVar(&f.format, "format", "auto", "trace format: auto (by extension), mooncake or azure")
	fs.StringVar(&f.policies, "policies", "all", "comma-separated policies or \"all\" ("+strings.Join(routing.PolicyNames(), ", ")+
		"; with --cpu-blocks also "+routing.PolicyPrefixMeshGPU+", prefixmesh ranking by the GPU prefix alone)")
	fs.StringVar(&f.jsonOut, "json", "", "write the results as JSON to this file")
	fs.StringVar(&f.plotOut, "plot", "", "write a PNG chart of the results to this file")
	fs.IntVar(&f.nodes, "nodes", def.Nodes, "number of nodes")
	fs.IntVar(&f.blocks, "kv-blocks", def.BlocksPerNode, "KV blocks per node")
	fs.IntVar(&f.blockSize, "block-size", def.BlockSize, "tokens per KV block")
	fs.IntVar(&f.cpuBlocks, "cpu-blocks", def.CPUBlocks, "CPU KV tier per node, in GPU-sized blocks: GPU evictions spill into it and hits after the GPU prefix load at --cpu-load-tokens-per-s (0: no tier)")
	fs.IntVar(&f.cpuChunk, "cpu-chunk-blocks", def.CPUChunkBlocks, "GPU blocks per CPU block, spilled, loaded and evicted whole (vLLM's offloaded block size over the GPU's)")
	fs.Float64Var(&f.cpuLoad, "cpu-load-tokens-per-s", def.CPULoadTokensPerSec, "rate at which CPU-tier tokens load back into the GPU")
	fs.IntVar(&f.limit, "limit", 0, "replay only the first n requests (0: all)")
	fs.IntVar(&f.maxConc, "max-concurrent", def.MaxConcurrent, "sequences a node runs at once")
	fs.IntVar(&f.tokenBudget, "token-budget", def.TokenBudget, "most tokens one engine step schedules, decode sequences included (vLLM's max_num_batched_tokens): longer prompts prefill in chunks, each slowing the decode sequences sharing its step")
	fs.IntVar(&f.prefillNodes, "prefill-nodes", 0, "disaggregate: nodes 0..n-1 run prefill legs only, the others decode (0: every node serves whole requests)")
	fs.StringVar(&f.disaggregate, "disaggregate", string(def.Disaggregate), "with --prefill-nodes, when a prefill runs on a prefill node, comma-separated for a run each: auto (the router's predicted TTFT), always, never, llmd (llm-d's prefix-based decider, --llmd-non-cached-tokens), dynamo (Dynamo's isl_bounding)")
	fs.IntVar(&f.llmdNonCached, "llmd-non-cached-tokens", def.LLMDNonCachedTokens, "llm-d's nonCachedTokens for --disaggregate llmd: disaggregate when at least this many prompt tokens are not on the decode node's GPU")
	fs.Float64Var(&f.kvRate, "kv-transfer-tokens-per-s", def.KVTransferTokensPerSec, "with --prefill-nodes, the rate at which a prompt's KV moves from its prefill node to its decode node (the simulator's ground truth; routers learn it from what they observe)")
	fs.DurationVar(&f.kvOverhead, "kv-transfer-overhead", def.KVTransferOverhead, "with --prefill-nodes or --peer-pull, the fixed time of each KV transfer")
	fs.Float64Var(&f.decodeStall, "decode-stall", def.Policy.DecodeStall, "with --prefill-nodes, the weight in prefixmesh's P/D decision of the stall a local prefill puts into the decode node's running sequences (routing.PolicyConfig.DecodeStall; 0: first tokens alone)")
	fs.BoolVar(&f.peerPull, "peer-pull", def.Policy.PeerPull, "the router may have the chosen node pull the prompt's prefix from a node holding more of it (routing.PolicyConfig.PeerPull), at --kv-transfer-tokens-per-s")
	fs.IntVar(&f.parallel, "parallel", runtime.GOMAXPROCS(0), "policies simulated at once (output does not depend on it)")
	fs.IntVar(&f.systemPrompts, "azure-system-prompts", rdef.SystemPrompts, "Azure: shared system prompts laid over the trace (0: no synthetic prefix structure)")
	fs.Float64Var(&f.sessions, "azure-session-share", rdef.SessionShare, "Azure: share of requests continuing a recent conversation")
	fs.DurationVar(&f.arrivalQuantum, "arrival-quantum", 0, "round every arrival down to a multiple of this (after --speed), replaying bursts of simultaneous requests from any trace; 0: as recorded")
	fs.DurationVar(&f.slot, "admission-slot", routing.DefaultAdmissionSlot, "in bursts, each router waits this long per router whose id sorts before its own, so the routers decide in turn")
	fs.BoolVar(&f.noStagger, "no-burst-stagger", false, "routers decide the instant a request arrives, even when they have learned that their peers decide in the same instants (measures the stagger)")
	fs.BoolVar(&f.spread, "burst-spread", false, "prefixmesh spreads a request over the nodes a burst would fill when the routers have learned that decisions arrive together (off by default; measures the spread)")
	fs.Float64Var(&f.speed, "speed", 1, "replay speed factor (2 = arrivals twice as fast)")
	fs.Float64Var(&f.loss, "loss", 0, "probability that a summary delta is lost (repaired by a snapshot)")
	fs.Float64Var(&f.prefill, "prefill-tokens-per-s", def.PrefillTokensPerSec, "uncached prefill rate of a node")
	fs.BoolVar(&f.noLearn, "no-ttft-learning", false, "routers do not learn each node's time to first token from what they observe (measures the learning)")
	fs.StringVar(&f.nodeSpeeds, "node-speeds", "", "comma-separated speed factors applied to the nodes in turn (e.g. 1,1,1,0.5: every fourth node at half speed); routers are not told and learn them from first tokens")
	fs.Float64Var(&f.decode, "decode-tokens-per-s", def.DecodeTokensPerSec, "decode rate of one sequence")
	fs.Uint64Var(&f.seed, "seed", 0, "seed of the loss process and of Azure's synthetic prefixes")
	fs.Float64Var(&f.loadFactor, "load-factor", def.Policy.LoadFactor, "c of the bounded-load guard (policies prefixmesh, chwbl)")
	fs.Float64Var(&f.missPenalty, "miss-penalty", def.Policy.MissPenalty, "extra weight of uncached prefill tokens in prefixmesh's cost")
	fs.IntVar(&f.minLoadBound, "min-load-bound", def.Policy.MinLoadBound, "floor of the bounded-load guard's per-node capacity, in requests")
	fs.DurationVar(&f.delay, "delay", def.Delay, "propagation delay of summary deltas and load reports")
	fs.DurationVar(&f.repairDelay, "repair-delay", def.RepairDelay, "time a repair (full summary pull) takes")
	fs.StringVar(&f.routers, "routers", "1", "comma-separated router counts to simulate (each a run per policy), e.g. 1,3,8")
	fs.StringVar(&f.sharing, "sharing", "on", "router-to-router sharing of decisions and load: on, off, or on,off for both")
	fs.DurationVar(&f.shareDelay, "share-delay", def.ShareDelay, "latency of a router-to-router message")
	fs.Float64Var(&f.shareLoss, "share-loss", 0, "probability that a router-to-router packet is lost")
	fs.DurationVar(&f.shareInterval, "share-interval", def.ShareInterval, "how often a router reports its in-flight load to the others while it changes")
	fs.DurationVar(&f.loadInterval, "load-interval", def.LoadInterval, "how often a node reports its load (the daemons' 200 ms; 0: after every change)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "router sim: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	rep, err := simulate(ctx, f, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "router sim: %v\n", err)
		return 1
	}
	writeTable(stdout, rep)
	if f.jsonOut != "" {
		if err := writeJSON(f.jsonOut, rep); err != nil {
			fmt.Fprintf(stderr, "router sim: %v\n", err)
			return 1
		}
	}
	if f.plotOut != "" {
		if err := writePlot(f.plotOut, rep); err != nil {
			fmt.Fprintf(stderr, "router sim: %v\n", err)
			return 1
		}
	}
	return 0
}

// simulate reads the trace and runs every policy and the references.
func simulate(ctx context.Context, f simFlags, stderr io.Writer) (*simReport, error) {
	cfg := sim.DefaultConfig()
	cfg.Nodes, cfg.BlocksPerNode, cfg.BlockSize, cfg.MaxConcurrent = f.nodes, f.blocks, f.blockSize, f.maxConc
	cfg.CPUBlocks, cfg.CPUChunkBlocks, cfg.CPULoadTokensPerSec = f.cpuBlocks, f.cpuChunk, f.cpuLoad
	cfg.PrefillTokensPerSec, cfg.DecodeTokensPerSec = f.prefill, f.decode
	cfg.Delay, cfg.RepairDelay, cfg.Loss, cfg.Seed = f.delay, f.repairDelay, f.loss, f.seed
	cfg.Policy.LoadFactor, cfg.Policy.MinLoadBound, cfg.Policy.MissPenalty = f.loadFactor, f.minLoadBound, f.missPenalty
	cfg.ShareDelay, cfg.ShareLoss, cfg.ShareInterval, cfg.LoadInterval = f.shareDelay, f.shareLoss, f.shareInterval, f.loadInterval
	cfg.NoAdmissionDelay, cfg.Spread, cfg.NoTTFTLearning = f.noStagger, f.spread, f.noLearn
	cfg.AdmissionSlot = f.slot
	cfg.TokenBudget, cfg.PrefillNodes, cfg.LLMDNonCachedTokens = f.tokenBudget, f.prefillNodes, f.llmdNonCached
	cfg.KVTransferTokensPerSec, cfg.KVTransferOverhead = f.kvRate, f.kvOverhead
	cfg.Policy.PeerPull, cfg.Policy.DecodeStall = f.peerPull, f.decodeStall
	modes, err := parseDisagg(f.disaggregate, f.prefillNodes)
	if err != nil {
		return nil, err
	}
	if len(modes) > 0 {
		cfg.Disaggregate = modes[0]
	}
	if f.nodeSpeeds != "" {
		for _, p := range strings.Split(f.nodeSpeeds, ",") {
			v, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
			if err != nil {
				return nil, fmt.Errorf("--node-speeds: bad factor %q", p)
			}
			cfg.NodeSpeeds = append(cfg.NodeSpeeds, v)
		}
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	routerCounts, err := parseInts(f.routers)
	if err != nil {
		return nil, fmt.Errorf("--routers: %w", err)
	}
	sharings, err := parseSharing(f.sharing)
	if err != nil {
		return nil, err
	}
	if !(f.speed > 0) || f.limit < 0 || f.arrivalQuantum < 0 {
		return nil, fmt.Errorf("--speed must be positive and --limit and --arrival-quantum non-negative")
	}
	policies, err := parsePolicies(f.policies, cfg.CPUBlocks > 0)
	if err != nil {
		return nil, err
	}
	ropt := sim.ReadOptions{Speed: f.speed, Limit: f.limit, Seed: f.seed, SystemPrompts: f.systemPrompts, SessionShare: f.sessions}
	var tr *sim.Trace
	path := f.trace
	if f.trace == "fork" || strings.HasPrefix(f.trace, "fork:") {
		tr, err = sim.ForkTrace(f.trace, ropt) // generated: agent fan-out
	} else if path, err = findTrace(f.trace); err == nil {
		tr, err = readTrace(path, f.format, ropt)
	}
	if err != nil {
		return nil, err
	}
	if len(tr.Requests) == 0 {
		return nil, fmt.Errorf("trace %s has no requests", path)
	}
	if f.arrivalQuantum > 0 {
		if err := tr.QuantizeArrivals(f.arrivalQuantum); err != nil {
			return nil, err
		}
	}

	type combo struct {
		policy  string
		routers int
		sharing bool
		mode    sim.Disagg
	}
	var combos []combo
	for _, r := range routerCounts {
		for i, sh := range sharings {
			if r == 1 && i > 0 {
				continue // one router has nobody to share with: one run
			}
			for _, m := range modes {
				for _, p := range policies {
					combos = append(combos, combo{p, r, sh, m})
				}
			}
			if len(modes) == 0 {
				for _, p := range policies {
					combos = append(combos, combo{p, r, sh, cfg.Disaggregate})
				}
			}
		}
	}
	for _, c := range combos {
		cc := cfg
		cc.Routers, cc.Sharing, cc.Disaggregate = c.routers, c.sharing, c.mode
		if err := cc.Validate(); err != nil {
			return nil, err
		}
	}

	start := time.Now()
	rep := &simReport{Policies: make([]sim.Result, len(combos)), trace: f.trace, cfg: cfg}
	rep.Config = simConfigJSON{Trace: f.trace, Requests: len(tr.Requests), Nodes: cfg.Nodes, KVBlocks: cfg.BlocksPerNode,
		CPUBlocks: cfg.CPUBlocks, CPUChunkBlocks: cfg.CPUChunkBlocks, CPULoadTokensPerSec: cfg.CPULoadTokensPerSec,
		BlockSize: cfg.BlockSize, PrefillTokensPerSec: cfg.PrefillTokensPerSec, DecodeTokensPerSec: cfg.DecodeTokensPerSec,
		MaxConcurrent: cfg.MaxConcurrent, DelayS: cfg.Delay.Seconds(), Loss: cfg.Loss, RepairDelayS: cfg.RepairDelay.Seconds(),
		Speed: f.speed, Limit: f.limit, Seed: f.seed, LoadFactor: cfg.Policy.LoadFactor, MinLoadBound: cfg.Policy.MinLoadBound,
		MissPenalty: cfg.Policy.MissPenalty, NodeSpeeds: cfg.NodeSpeeds, NoTTFTLearning: cfg.NoTTFTLearning, Policies: policies, Routers: routerCounts, Sharing: sharings,
		LoadIntervalS: cfg.LoadInterval.Seconds(), ShareDelayS: cfg.ShareDelay.Seconds(), ShareLoss: cfg.ShareLoss,
		ShareIntervalS: cfg.ShareInterval.Seconds(), ArrivalQuantumS: f.arrivalQuantum.Seconds(),
		BurstStagger: !f.noStagger, BurstSpread: f.spread, TokenBudget: cfg.TokenBudget, PeerPull: cfg.Policy.PeerPull,
		DecodeStall: cfg.Policy.DecodeStall}
	if cfg.PrefillNodes > 0 {
		rep.Config.PrefillNodes, rep.Config.LLMDNonCachedTokens = cfg.PrefillNodes, cfg.LLMDNonCachedTokens
		rep.Config.KVTransferTokensPerSec, rep.Config.KVTransferOverheadS = cfg.KVTransferTokensPerSec, cfg.KVTransferOverhead.Seconds()
		for _, m := range modes {
			rep.Config.Disaggregate = append(rep.Config.Disaggregate, string(m))
		}
	}

	// One job per run plus the references; each is independent and deterministic, so the
	// results do not depend on how many run at once.
	done := make([]atomic.Int64, len(combos))
	errs := make([]error, len(combos)+1)
	jobs := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < max(1, f.parallel); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				if j == len(combos) {
					rep.Reference, errs[j] = sim.References(tr, cfg)
					continue
				}
				c := cfg
				c.Routers, c.Sharing, c.Disaggregate = combos[j].routers, combos[j].sharing, combos[j].mode
				c.Progress = func(n, _ int) bool {
					done[j].Store(int64(n))
					return ctx.Err() == nil
				}
				rep.Policies[j], errs[j] = sim.Run(tr, combos[j].policy, c)
			}
		}()
	}
	stop := make(chan struct{})
	var pwg sync.WaitGroup
	pwg.Add(1)
	go func() {
		defer pwg.Done()
		reportProgress(stderr, stop, done, len(tr.Requests))
	}()
	jobs <- len(combos) // the references first: the longest job, it overlaps the policies
	for j := range combos {
		jobs <- j
	}
	close(jobs)
	wg.Wait()
	close(stop)
	pwg.Wait()
	rep.elapsed = time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return rep, nil
}

// reportProgress prints the share of requests routed, over all policies, at most every
// progressEvery and only after another progressStep percent, until stop closes.
func reportProgress(w io.Writer, stop <-chan struct{}, done []atomic.Int64, total int) {
	t := time.NewTicker(progressEvery)
	defer t.Stop()
	last := -progressStep
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			var sum int64
			for i := range done {
				sum += done[i].Load()
			}
			if pct := int(100 * sum / int64(total*len(done))); pct >= last+progressStep {
				fmt.Fprintf(w, "router sim: %d%% of %d requests × %d runs routed\n", pct, total, len(done))
				last = pct
			}
		}
	}
}

// parseInts parses a comma-separated list of router counts.
func parseInts(s string) ([]int, error) {
	var out []int
	for _, p := range strings.Split(s, ",") {
		var n int
		if _, err := fmt.Sscanf(strings.TrimSpace(p), "%d", &n); err != nil || n <= 0 {
			return nil, fmt.Errorf("bad router count %q", p)
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out, nil
}

// parseSharing parses --sharing: on, off, or both in the given order.
func parseSharing(s string) ([]bool, error) {
	var out []bool
	for _, p := range strings.Split(s, ",") {
		switch strings.TrimSpace(p) {
		case "on":
			out = append(out, true)
		case "off":
			out = append(out, false)
		default:
			return nil, fmt.Errorf("--sharing: %q is not on or off", p)
		}
	}
	return out, nil
}

// parseDisagg parses --disaggregate: the modes to run, in the given order, without repeats. On an
// aggregated fleet (no prefill nodes) there is nothing to decide: only the default is accepted,
// and no mode is returned.
func parseDisagg(s string, prefillNodes int) ([]sim.Disagg, error) {
	var out []sim.Disagg
	for _, p := range strings.Split(s, ",") {
		m := sim.Disagg(strings.TrimSpace(p))
		if !slices.Contains(sim.DisaggModes(), m) {
			return nil, fmt.Errorf("--disaggregate: %q is not one of auto, always, never, llmd, dynamo", p)
		}
		if !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	if prefillNodes == 0 {
		if len(out) != 1 || out[0] != sim.DefaultConfig().Disaggregate {
			return nil, fmt.Errorf("--disaggregate %s needs prefill nodes (--prefill-nodes)", s)
		}
		return nil, nil
	}
	return out, nil
}

// parsePolicies parses --policies. With tiers (a CPU tier on the nodes) the choice also has
// prefixmesh-gpu, prefixmesh ranking by the GPU prefix alone, and "all" lists it after
// prefixmesh; without, it would be a second prefixmesh row, so it is not offered.
func parsePolicies(s string, tiers bool) ([]string, error) {
	names := routing.PolicyNames()
	if tiers {
		names = slices.Insert(names, 1, routing.PolicyPrefixMeshGPU)
	}
	if s == "" || s == "all" {
		return names, nil
	}
	var out []string
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		if p == routing.PolicyPrefixMeshGPU && !tiers {
			return nil, fmt.Errorf("policy %q differs from %q only when nodes have a CPU tier (--cpu-blocks)", p, routing.PolicyPrefixMesh)
		}
		if !slices.Contains(names, p) {
			return nil, fmt.Errorf("unknown policy %q (have %s)", p, strings.Join(names, ", "))
		}
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out, nil
}

// findTrace resolves a relative path against the working directory, then against the module
// root (the nearest ancestor with go.mod), so the default works from anywhere in the repo.
func findTrace(p string) (string, error) {
	if _, err := os.Stat(p); err == nil || filepath.IsAbs(p) {
		return p, err
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			q := filepath.Join(dir, p)
			if _, err := os.Stat(q); err != nil {
				return "", fmt.Errorf("trace %s: not found from the working directory or the module root %s", p, dir)
			}
			return q, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("trace %s: not found", p)
		}
		dir = parent
	}
}

func readTrace(path, format string, opt sim.ReadOptions) (*sim.Trace, error) {
	if format == "auto" {
		format = "mooncake"
		if strings.HasSuffix(strings.ToLower(path), ".csv") {
			format = "azure"
		}
	}
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open trace: %w", err)
	}
	defer fh.Close()
	var tr *sim.Trace
	switch format {
	case "mooncake":
		tr, err = sim.ReadMooncake(fh, opt)
	case "azure":
		tr, err = sim.ReadAzure(fh, opt)
	default:
		return nil, fmt.Errorf("unknown --format %q (auto, mooncake or azure)", format)
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return tr, nil
}

// writeTable prints one row per policy and the reference rows.
func writeTable(w io.Writer, rep *simReport) {
	c := rep.cfg
	quantum := ""
	if rep.Config.ArrivalQuantumS > 0 {
		quantum = fmt.Sprintf("; arrivals rounded down to %v", time.Duration(rep.Config.ArrivalQuantumS*float64(time.Second)))
	}
	if len(c.NodeSpeeds) > 0 {
		quantum += fmt.Sprintf("; node speeds %v in turn", c.NodeSpeeds)
	}
	tier := ""
	if c.CPUBlocks > 0 {
		tier = fmt.Sprintf(" + a CPU tier of %d blocks (chunks of %d), loaded at %.0f tok/s", c.CPUBlocks, c.CPUChunkBlocks, c.CPULoadTokensPerSec)
	}
	pd := ""
	if c.PrefillNodes > 0 {
		pd = fmt.Sprintf("; disaggregated: nodes 0-%d prefill, %d decode, KV moves at %.0f tok/s + %v (llm-d's nonCachedTokens %d)",
			c.PrefillNodes-1, c.Nodes-c.PrefillNodes, c.KVTransferTokensPerSec, c.KVTransferOverhead, c.LLMDNonCachedTokens)
	}
	fmt.Fprintf(w, "trace %s: %d requests; %d nodes × %d blocks of %d tokens%s; prefill %.0f tok/s, decode %.0f tok/s/seq, %d seqs/node, steps of up to %d tokens; delay %v, loss %.3g%s%s\n\n",
		rep.trace, rep.Config.Requests, c.Nodes, c.BlocksPerNode, c.BlockSize, tier, c.PrefillTokensPerSec, c.DecodeTokensPerSec, c.MaxConcurrent, c.TokenBudget, c.Delay, c.Loss, quantum, pd)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	// With a CPU tier a column after the hit ratio says how much of it the tier loaded.
	cpuCol, cpuBlank := "", ""
	if c.CPUBlocks > 0 {
		cpuCol, cpuBlank = "of it CPU %\t", "\t"
	}
	// With prefill nodes, two columns after the policy: the rule, and how many it sent remote.
	pdCol, pdBlank := "", ""
	if c.PrefillNodes > 0 {
		pdCol, pdBlank = "P/D\tremote %\t", "\t\t"
	}
	// With peer pulls, a column after the hit ratio: the share of requests that pulled.
	pullCol, pullBlank := "", ""
	if slices.ContainsFunc(rep.Policies, func(r sim.Result) bool { return r.PeerPullPlannedShare > 0 }) {
		pullCol, pullBlank = "pulled %\t", "\t"
	}
	fmt.Fprintln(tw, "policy\t"+pdCol+"routers\tsharing\thit %\t"+cpuCol+pullCol+"vs pooled\tTTFT mean s\tp50 s\tp99 s\tITL mean ms\tITL p99 ms\tE2E mean s\timb prefill\timb in-flight\test exact %\test MAE tok\tshare B/s/router\tstaggered %\tstagger ms\t")
	pooled := rep.Reference.PooledLRUHitRatio
	for _, r := range rep.Policies {
		vs := "-"
		if pooled > 0 {
			vs = fmt.Sprintf("%.1f%%", 100*r.HitRatio/pooled)
		}
		share := "-"
		if r.Routers > 1 {
			share = "off"
			if r.Sharing {
				share = "on"
			}
		}
		cpu := ""
		if cpuCol != "" {
			cpu = fmt.Sprintf("%.2f\t", 100*r.CPUHitRatio)
		}
		if pullCol != "" {
			cpu += fmt.Sprintf("%.1f\t", 100*r.PeerPullShare)
		}
		pdc := ""
		if pdCol != "" {
			pdc = fmt.Sprintf("%s\t%.1f\t", r.Disaggregate, 100*r.RemotePrefillShare)
		}
		fmt.Fprintf(tw, "%s\t%s%d\t%s\t%.2f\t%s%s\t%.3f\t%.3f\t%.3f\t%.1f\t%.1f\t%.3f\t%.3f\t%.3f\t%.2f\t%.1f\t%.0f\t%.1f\t%.2f\t\n", r.Name, pdc, r.Routers, share, 100*r.HitRatio, cpu, vs,
			r.TTFTMean, r.TTFTP50, r.TTFTP99, 1000*r.ITLMean, 1000*r.ITLP99, r.E2EMean, r.ImbalancePrefill, r.ImbalanceInFlight, 100*r.EstimateExactShare, r.EstimateMAETokens,
			r.ShareBytesPerRouterPerSec, 100*r.StaggeredShare, r.StaggerMeanMs)
	}
	fmt.Fprintf(tw, "pooled LRU (reference, not a bound)\t%s\t\t%.2f\t%s100.0%%\t\t\t\t\t\t\t\t\t\t\t\t\n", pdBlank, 100*pooled, cpuBlank+pullBlank)
	fmt.Fprintf(tw, "infinite cache (bound)\t%s\t\t%.2f\t%s\t\t\t\t\t\t\t\t\t\t\t\t\t\n", pdBlank, 100*rep.Reference.InfiniteHitRatio, cpuBlank+pullBlank)
	tw.Flush()
	for _, r := range rep.Policies {
		if r.Rejected > 0 {
			fmt.Fprintf(w, "%s: %d requests larger than a node's pool were rejected\n", r.Name, r.Rejected)
		}
	}
	fmt.Fprintf(w, "\n(simulated in %.1f s of wall time)\n", rep.elapsed.Seconds())
}

func writeJSON(path string, rep *simReport) error {
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return fmt.Errorf("encode json: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write json: %w", err)
	}
	return nil
}

// plotRuns picks the runs a chart shows: all of them when there is one router count, else every
// policy at the fewest routers and prefixmesh at every other count (dozens of bars are unreadable;
// the JSON and the table have every run).
func plotRuns(all []sim.Result) []sim.Result {
	fewest := 0
	for _, r := range all {
		if fewest == 0 || r.Routers < fewest {
			fewest = r.Routers
		}
	}
	var out []sim.Result
	for _, r := range all {
		if r.Routers == fewest || r.Name == routing.PolicyPrefixMesh {
			out = append(out, r)
		}
	}
	return out
}

// runName labels a run: the policy, and with several routers their count and sharing.
func runName(r *sim.Result) string {
	name := r.Name
	if r.Disaggregate != "" {
		name += " P/D " + r.Disaggregate
	}
	if r.Routers <= 1 {
		return name
	}
	if r.Sharing {
		return fmt.Sprintf("%s R=%d shared", name, r.Routers)
	}
	return fmt.Sprintf("%s R=%d alone", name, r.Routers)
}

// plotPoints bounds the points of each CDF curve: more than the pixels across adds nothing.
const plotPoints = 400

// writePlot draws hit ratio (with the references), TTFT mean and p99, and the TTFT CDFs.
func writePlot(path string, rep *simReport) error {
	const w, h = 1600, 1150
	c := plot.New(w, h)
	var names []string
	var hit, mean, p99 []float64
	runs := plotRuns(rep.Policies)
	for _, r := range runs {
		names = append(names, runName(&r))
		hit = append(hit, 100*r.HitRatio)
		mean = append(mean, r.TTFTMean)
		p99 = append(p99, r.TTFTP99)
	}
	hitNames := append(slices.Clone(names), "pooled LRU (ref)", "infinite (ref)")
	hit = append(hit, 100*rep.Reference.PooledLRUHitRatio, 100*rep.Reference.InfiniteHitRatio)
	c.DrawHBars(image.Rect(0, 0, w/2, h/2), plot.HBars{
		Title: "Prefix hit ratio (% of prompt tokens)", Categories: hitNames,
		Series: []plot.Series{{Name: "hit ratio", Values: hit, Color: plot.Palette[0]}},
		Format: func(v float64) string { return fmt.Sprintf("%.1f%%", v) },
	})
	c.DrawHBars(image.Rect(w/2, 0, w, h/2), plot.HBars{
		Title: "Time to first token (s)", Categories: names,
		Series: []plot.Series{{Name: "mean", Values: mean, Color: plot.Palette[0]}, {Name: "p99", Values: p99, Color: plot.Palette[1]}},
		Format: func(v float64) string { return fmt.Sprintf("%.2f", v) },
	})
	var curves []plot.Curve
	for i, r := range runs {
		var xs, ys []float64
		n := len(r.TTFTs)
		for k := 0; k < plotPoints && n > 0; k++ {
			j := min(n-1, k*n/plotPoints)
			xs = append(xs, max(r.TTFTs[j], 1e-3)) // a fully cached prompt costs 0: show it at 1 ms
			ys = append(ys, float64(j+1)/float64(n))
		}
		if n > 0 {
			xs, ys = append(xs, max(r.TTFTs[n-1], 1e-3)), append(ys, 1)
		}
		curves = append(curves, plot.Curve{Name: runName(&r), X: xs, Y: ys, Color: plot.Palette[i%len(plot.Palette)]})
	}
	c.DrawLines(image.Rect(0, h/2, w, h), plot.Lines{
		Title:  fmt.Sprintf("TTFT distribution (CDF): %d nodes, %s", rep.cfg.Nodes, filepath.Base(rep.trace)),
		XLabel: "time to first token (s, log scale)", LogX: true, YMin: 0, YMax: 1, Curves: curves,
	})
	var buf bytes.Buffer
	if err := c.EncodePNG(&buf); err != nil {
		return fmt.Errorf("encode png: %w", err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("write plot: %w", err)
	}
	return nil
}
