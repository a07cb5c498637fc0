package agentd

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prefixmesh/prefixmesh/cluster"
)

// Probing a real engine (--engine=vllm|sglang): its health decides the agent's, its /metrics
// give its load and its process start time (a change means the engine restarted, possibly
// without a word on the event stream), and /v1/models names the model when --model is not set.
const (
	// probeInterval: 250 ms, so the load gossiped for the engine (DESIGN.md §5 refreshes load every
	// 200 ms) is at most a quarter second old and health follows the engine within half a second;
	// two small GETs on loopback four times a second cost the engine nothing measurable.
	probeInterval = 250 * time.Millisecond
	// probeTimeout bounds each probe request: an engine that takes longer is reported unhealthy.
	probeTimeout = 2 * time.Second
	// maxMetricsBytes bounds the /metrics body read: vLLM's is ~100 KB with histograms.
	maxMetricsBytes = 4 << 20
	// modelsRetry is the pause between /v1/models attempts while the engine starts (loading
	// weights can take minutes).
	modelsRetry = time.Second
)

// engineProbe follows one engine over HTTP. Start runs its loop; the latest findings are read
// with healthy and load.
type engineProbe struct {
	base      string
	client    *http.Client
	log       *slog.Logger
	onRestart func() // called from the probe goroutine when the engine's start time changes

	ok      atomic.Bool
	mu      sync.Mutex // guards ld and started
	ld      cluster.Load
	started float64 // process_start_time_seconds last seen; 0 unknown
	wg      sync.WaitGroup
}

func newEngineProbe(base string, log *slog.Logger, onRestart func()) *engineProbe {
	return &engineProbe{base: strings.TrimSuffix(base, "/"), client: &http.Client{Timeout: probeTimeout}, log: log, onRestart: onRestart}
}

// start probes once (so health is known at once) and then every probeInterval until ctx ends.
func (p *engineProbe) start(ctx context.Context) {
	p.probe(ctx)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(probeInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				p.probe(ctx)
			}
		}
	}()
}

func (p *engineProbe) wait() { p.wg.Wait() }

func (p *engineProbe) healthy() bool { return p.ok.Load() }

func (p *engineProbe) load() cluster.Load {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ld
}

func (p *engineProbe) probe(ctx context.Context) {
	ok := p.get(ctx, "/health", func(io.Reader) error { return nil }) == nil
	if was := p.ok.Swap(ok); was != ok {
		p.log.Info("engine health changed", "healthy", ok, "url", p.base)
	}
	if !ok {
		return
	}
	var started float64
	var ld cluster.Load
	err := p.get(ctx, "/metrics", func(r io.Reader) error {
		started, ld = parseEngineMetrics(io.LimitReader(r, maxMetricsBytes))
		return nil
	})
	if err != nil {
		return // an engine without /metrics: no load, no restart detection beyond the stream
	}
	p.mu.Lock()
	prev := p.started
	if started != 0 {
		p.started = started
	}
	p.ld = ld
	p.mu.Unlock()
	if prev != 0 && started != 0 && started != prev {
		p.log.Warn("engine restarted (process start time changed)", "before", prev, "now", started)
		if p.onRestart != nil {
			p.onRestart()
		}
	}
}

var errStatus = errors.New("engine answered")

func (p *engineProbe) get(ctx context.Context, path string, read func(io.Reader) error) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.base+path, nil)
	if err != nil {
		return err
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("%w %d for %s", errStatus, resp.StatusCode, path)
	}
	return read(resp.Body)
}

// parseEngineMetrics reads the Prometheus text format for the process start time and the load
// gauges of vLLM (vllm:num_requests_running / _waiting), SGLang (sglang:num_running_reqs /
// num_queue_reqs) and the simulated engine (prefixmesh_simengine_running / queue_depth /
// free_blocks / queued_prefill_tokens), summed over label sets (DP ranks, models).
func parseEngineMetrics(r io.Reader) (started float64, ld cluster.Load) {
	var running, waiting, free, prefill float64
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest, ok := strings.Cut(line, " ")
		if i := strings.IndexByte(name, '{'); i >= 0 {
			name = name[:i]
			if j := strings.LastIndexByte(line, '}'); j >= 0 {
				rest, ok = strings.TrimSpace(line[j+1:]), true
			}
		}
		if !ok {
			continue
		}
		valStr, _, _ := strings.Cut(strings.TrimSpace(rest), " ")
		v, err := strconv.ParseFloat(valStr, 64)
		if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
			continue
		}
		switch name {
		case "process_start_time_seconds":
			started = v
		case "vllm:num_requests_running", "sglang:num_running_reqs", "prefixmesh_simengine_running":
			running += v
		case "vllm:num_requests_waiting", "sglang:num_queue_reqs", "prefixmesh_simengine_queue_depth":
			waiting += v
		case "prefixmesh_simengine_free_blocks":
			free += v
		case "prefixmesh_simengine_queued_prefill_tokens":
			prefill += v
		}
	}
	ld = cluster.Load{Running: saturate[uint32](running), Waiting: saturate[uint32](waiting),
		FreeBlocks: saturate[uint64](free), QueuedPrefillTokens: saturate[uint64](prefill)}
	return started, ld
}

// saturate converts a finite sum to an unsigned count, clamped to [0, the type's maximum]: Go
// leaves an out-of-range float conversion implementation-defined (on amd64 a huge gauge wraps
// to a small or zero count, which would make a loaded engine look idle).
func saturate[T uint32 | uint64](v float64) T {
	maxT := ^T(0)
	switch {
	case v <= 0:
		return 0
	case v >= float64(maxT):
		return maxT
	}
	return T(v)
}

// maxModelsBytes bounds the /v1/models body: a few hundred adapters' entries.
const maxModelsBytes = 1 << 20

// engineModel asks the engine which model it serves (GET /v1/models), retrying every modelsRetry
// until it answers or ctx ends: the first entry that is a base model (no "parent", as vLLM lists
// LoRA adapters with their base as parent).
func engineModel(ctx context.Context, base string, log *slog.Logger) (string, error) {
	client := &http.Client{Timeout: probeTimeout}
	base = strings.TrimSuffix(base, "/")
	for attempt := 0; ; attempt++ {
		m, err := fetchModel(ctx, client, base)
		if err == nil {
			return m, nil
		}
		if attempt%10 == 0 {
			log.Info("waiting for the engine's /v1/models", "url", base, "err", err)
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("engine model: %w", context.Cause(ctx))
		case <-time.After(modelsRetry):
		}
	}
}

func fetchModel(ctx context.Context, client *http.Client, base string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/models", nil)
	if err != nil {
		return "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%w %d", errStatus, resp.StatusCode)
	}
	var body struct {
		Data []struct {
			ID     string  `json:"id"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxModelsBytes)).Decode(&body); err != nil {
		return "", fmt.Errorf("decode /v1/models: %w", err)
	}
	for _, d := range body.Data {
		if d.ID != "" && (d.Parent == nil || *d.Parent == "") {
			return d.ID, nil
		}
	}
	return "", errors.New("/v1/models lists no base model")
}
