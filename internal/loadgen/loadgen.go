// Package loadgen replays a list of timed requests against an OpenAI-compatible endpoint (the
// router's front door or an engine) and summarises what came back: per request the status, the
// node that served it, the router's estimate of the reused tokens (X-Prefixmesh-Estimated-Tokens),
// the tokens the engine actually reused (X-Prefixmesh-Cached-Tokens or usage.cached_tokens) and
// the time to the first streamed token. Requests start at their scheduled offsets (scaled by
// Speed) with at most Concurrency in flight; a request that cannot start on time starts late and
// its lateness is counted, so an overloaded target shows up instead of being hidden.
package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Request is one replayed completion: a token-id prompt sent at offset At from the start.
type Request struct {
	At        time.Duration
	Tokens    []uint32
	MaxTokens int
	Session   string // sent as X-Session-ID when set
}

// Result is what one request observed.
type Result struct {
	Status    int
	Node      string // X-Prefixmesh-Node
	Estimate  int    // X-Prefixmesh-Estimated-Tokens; -1 when absent (not behind a router)
	Cached    int    // tokens the engine reused
	Prompt    int
	TTFT      time.Duration
	Latency   time.Duration
	Late      time.Duration // how much later than scheduled it started
	Err       error
	HasUsage  bool
	ErrorBody string
}

// Config says where and how to replay.
type Config struct {
	BaseURL     string // e.g. http://127.0.0.1:8000
	Model       string
	Concurrency int     // requests in flight at most; 0 means 64
	Speed       float64 // >1 replays faster than recorded; 0 means 1
	Client      *http.Client
	// Progress, when set, is called after each completed request (from several goroutines).
	Progress func(done, total int)
}

// Run replays reqs (sorted by At) and returns one Result per request, in the same order. It stops
// early with ctx's error when ctx ends; unfinished requests then carry that error.
func Run(ctx context.Context, cfg Config, reqs []Request) ([]Result, error) {
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 64
	}
	if cfg.Speed <= 0 {
		cfg.Speed = 1
	}
	if cfg.Client == nil {
		cfg.Client = http.DefaultClient
	}
	results := make([]Result, len(reqs))
	sem := make(chan struct{}, cfg.Concurrency)
	var wg sync.WaitGroup
	var mu sync.Mutex // guards done
	done := 0
	start := time.Now()
	for i := range reqs {
		due := start.Add(time.Duration(float64(reqs[i].At) / cfg.Speed))
		if wait := time.Until(due); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
			case <-t.C:
			}
		}
		select {
		case <-ctx.Done():
		case sem <- struct{}{}:
		}
		if ctx.Err() != nil {
			for j := i; j < len(reqs); j++ {
				results[j].Err = ctx.Err()
			}
			break
		}
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			results[i] = one(ctx, cfg, reqs[i])
			results[i].Late = max(0, time.Since(due)-results[i].Latency)
			mu.Lock()
			done++
			n := done
			mu.Unlock()
			if cfg.Progress != nil {
				cfg.Progress(n, len(reqs))
			}
		}(i)
	}
	wg.Wait()
	return results, ctx.Err()
}

type completionBody struct {
	Model     string   `json:"model"`
	Prompt    []uint32 `json:"prompt"`
	MaxTokens int      `json:"max_tokens"`
	Stream    bool     `json:"stream"`
}

type usage struct {
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

// maxErrorBody bounds how much of a failed response is kept for the report.
const maxErrorBody = 4 << 10

func one(ctx context.Context, cfg Config, r Request) Result {
	res := Result{Estimate: -1, Prompt: len(r.Tokens)}
	body, err := json.Marshal(completionBody{Model: cfg.Model, Prompt: r.Tokens, MaxTokens: max(1, r.MaxTokens), Stream: true})
	if err != nil {
		res.Err = err
		return res
	}
	begin := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(cfg.BaseURL, "/")+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		res.Err = err
		return res
	}
	req.Header.Set("Content-Type", "application/json")
	if r.Session != "" {
		req.Header.Set("X-Session-ID", r.Session)
	}
	resp, err := cfg.Client.Do(req)
	if err != nil {
		res.Err = err
		res.Latency = time.Since(begin)
		return res
	}
	defer resp.Body.Close()
	res.Status = resp.StatusCode
	res.Node = resp.Header.Get("X-Prefixmesh-Node")
	if v, err := strconv.Atoi(resp.Header.Get("X-Prefixmesh-Estimated-Tokens")); err == nil {
		res.Estimate = v
	}
	if v, err := strconv.Atoi(resp.Header.Get("X-Prefixmesh-Cached-Tokens")); err == nil {
		res.Cached, res.HasUsage = v, true
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		res.ErrorBody = string(b)
		res.Err = fmt.Errorf("status %d", resp.StatusCode)
		res.Latency = time.Since(begin)
		return res
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	sawDone := false
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if res.TTFT == 0 {
			res.TTFT = time.Since(begin)
		}
		if line == "[DONE]" {
			sawDone = true
			break
		}
		var u usage
		if json.Unmarshal([]byte(line), &u) == nil && u.Usage != nil && u.Usage.PromptTokensDetails != nil {
			res.Cached, res.HasUsage = u.Usage.PromptTokensDetails.CachedTokens, true
		}
	}
	res.Latency = time.Since(begin)
	if err := sc.Err(); err != nil {
		res.Err = err
	} else if !sawDone {
		res.Err = errors.New("stream ended without [DONE]")
	}
	return res
}
