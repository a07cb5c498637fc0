package drills

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// Load shape: a few closed-loop clients with a pause between requests keep the load bounded
// (at most a few hundred requests/s, most of it far less on a loaded machine) while a fault that
// loses requests shows up in seconds. Prompts share eight 64-token prefixes, so routing follows
// the caches, plus a unique tail.
const (
	loadClients    = 6
	loadPause      = 5 * time.Millisecond
	loadMaxTokens  = 4
	loadFamilies   = 8
	requestTimeout = 30 * time.Second // no request may hang the drills
)

// outcome is one request of the load.
type outcome struct {
	start, firstByte, end time.Time // firstByte zero when none arrived
	router                string    // front door address
	worker                int
	node                  string // X-Prefixmesh-Node
	status                int
	errBefore             string // failed before the first byte: what the client saw
	errAfter              string // failed after it (a stream cut off)
}

// load drives streaming completions through the routers in targets.
type load struct {
	mu       sync.Mutex // guards targets, outs
	targets  []string
	outs     []outcome
	inflight map[string]*atomic.Int64

	client *http.Client
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// newClient is the load's HTTP client: keep-alive connections, every request bounded.
func newClient() *http.Client {
	return &http.Client{Timeout: requestTimeout, Transport: &http.Transport{MaxIdleConnsPerHost: loadClients}}
}

func startLoad(targets []string) *load {
	ctx, cancel := context.WithCancel(context.Background())
	l := &load{targets: append([]string(nil), targets...), inflight: map[string]*atomic.Int64{}, cancel: cancel, client: newClient()}
	for _, t := range targets {
		l.inflight[t] = &atomic.Int64{}
	}
	for w := range loadClients {
		l.wg.Go(func() { l.worker(ctx, w) })
	}
	return l
}

// stop ends the load and waits for the requests in flight.
func (l *load) stop() {
	l.cancel()
	l.wg.Wait()
}

// setTargets replaces the routers new requests go to.
func (l *load) setTargets(targets []string) {
	l.mu.Lock()
	l.targets = append([]string(nil), targets...)
	l.mu.Unlock()
}

// drained waits (bounded) until no request to target is in flight.
func (l *load) drained(target string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for l.inflight[target].Load() > 0 {
		if time.Now().After(deadline) {
			return fmt.Errorf("%d requests to %s still in flight after %v", l.inflight[target].Load(), target, within)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

func (l *load) worker(ctx context.Context, w int) {
	rng := rand.New(rand.NewPCG(uint64(w), 15))
	for i := 0; ctx.Err() == nil; i++ {
		l.mu.Lock()
		targets := l.targets
		l.mu.Unlock()
		if len(targets) == 0 {
			return
		}
		target := targets[(w+i)%len(targets)]
		fam := rng.IntN(loadFamilies)
		toks := make([]int, 0, 80)
		for j := range 64 {
			toks = append(toks, 1000*(fam+1)+j)
		}
		for range 16 {
			toks = append(toks, 100000+rng.IntN(1<<20))
		}
		l.inflight[target].Add(1)
		o := l.one(target, toks)
		o.worker = w
		l.inflight[target].Add(-1)
		l.mu.Lock()
		l.outs = append(l.outs, o)
		l.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-time.After(loadPause):
		}
	}
}

// one sends one streaming completion and reads it to the end. It does not use the load's
// context: a request in flight when the load stops finishes (bounded by requestTimeout).
func (l *load) one(target string, tokens []int) (o outcome) {
	o = outcome{start: time.Now(), router: target}
	defer func() { o.end = time.Now() }()
	body, _ := json.Marshal(map[string]any{"model": "prefixmesh-sim", "prompt": tokens, "max_tokens": loadMaxTokens, "stream": true})
	req, err := http.NewRequest(http.MethodPost, "http://"+target+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		o.errBefore = err.Error()
		return o
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := l.client.Do(req)
	if err != nil {
		o.errBefore = err.Error()
		return o
	}
	defer resp.Body.Close()
	o.status, o.node = resp.StatusCode, resp.Header.Get("X-Prefixmesh-Node")
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		o.errBefore = fmt.Sprintf("status %d: %s", resp.StatusCode, bytes.TrimSpace(b))
		return o
	}
	r := bufio.NewReader(resp.Body)
	if _, err := r.Peek(1); err != nil {
		o.errBefore = "no first byte: " + err.Error()
		return o
	}
	o.firstByte = time.Now()
	all, err := io.ReadAll(r)
	switch {
	case err != nil:
		o.errAfter = err.Error()
	case !bytes.Contains(all, []byte("data: [DONE]")):
		o.errAfter = "stream ended without [DONE]"
	}
	return o
}

// settled waits (bounded) until every request that started before t has finished: each client
// is sequential, so once each has recorded a request that started at or after t (or stopped),
// none from before t is still in flight. A window read before that would miss exactly the
// requests that hung.
func (l *load) settled(t time.Time, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		l.mu.Lock()
		last := make(map[int]time.Time, loadClients)
		for _, o := range l.outs {
			if o.start.After(last[o.worker]) {
				last[o.worker] = o.start
			}
		}
		l.mu.Unlock()
		done := 0
		for w := range loadClients {
			if !last[w].Before(t) {
				done++
			}
		}
		if done == loadClients {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d clients still in a request started before %v", loadClients-done, loadClients, t.Format(time.StampMilli))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// window returns the outcomes of requests that started in [from, to).
func (l *load) window(from, to time.Time) []outcome {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []outcome
	for _, o := range l.outs {
		if !o.start.Before(from) && o.start.Before(to) {
			out = append(out, o)
		}
	}
	return out
}

// summary is what a window of outcomes says.
type summary struct {
	requests, errBefore, errAfter int
	firstErrors                   []string // a few, for the failure message
	maxWait                       time.Duration
	maxGap                        time.Duration // longest time without a completed request
	p50, p99                      time.Duration // time to first byte of the successful
	byNode                        map[string]int
}

func summarize(outs []outcome, from, to time.Time) summary {
	s := summary{requests: len(outs), byNode: map[string]int{}}
	var ttfb []time.Duration
	var ends []time.Time
	for _, o := range outs {
		switch {
		case o.errBefore != "":
			s.errBefore++
			if len(s.firstErrors) < 3 {
				s.firstErrors = append(s.firstErrors, o.router+": "+o.errBefore)
			}
		case o.errAfter != "":
			s.errAfter++
		default:
			ttfb = append(ttfb, o.firstByte.Sub(o.start))
			ends = append(ends, o.end)
			s.byNode[o.node]++
		}
		wait := o.end.Sub(o.start)
		if !o.firstByte.IsZero() {
			wait = o.firstByte.Sub(o.start)
		}
		s.maxWait = max(s.maxWait, wait)
	}
	sort.Slice(ttfb, func(i, j int) bool { return ttfb[i] < ttfb[j] })
	if n := len(ttfb); n > 0 {
		s.p50, s.p99 = ttfb[n/2], ttfb[min(n-1, n*99/100)]
	}
	sort.Slice(ends, func(i, j int) bool { return ends[i].Before(ends[j]) })
	prev := from
	for _, e := range ends {
		s.maxGap = max(s.maxGap, e.Sub(prev))
		prev = e
	}
	if len(ends) > 0 {
		s.maxGap = max(s.maxGap, to.Sub(prev))
	}
	return s
}

func (s summary) String() string {
	return fmt.Sprintf("%d requests, %d errors before the first byte, %d cut after it, first byte p50 %v p99 %v, longest wait %v, longest gap %v",
		s.requests, s.errBefore, s.errAfter, s.p50.Round(time.Millisecond), s.p99.Round(time.Millisecond),
		s.maxWait.Round(time.Millisecond), s.maxGap.Round(time.Millisecond))
}
