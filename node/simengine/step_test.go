package simengine

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixmesh/prefixmesh/local"
)

// handClock is a step clock the test moves by hand: SleepUntil returns once advanceTo reaches
// its time, so every step lasts exactly what the engine asked, whatever the machine's load.
type handClock struct {
	mu       sync.Mutex
	now      time.Time
	sleepers []*handSleeper // sleeping until their time, in no order
}

type handSleeper struct {
	at   time.Time
	wake chan struct{}
}

func (c *handClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *handClock) SleepUntil(ctx context.Context, t time.Time) error {
	c.mu.Lock()
	if !t.After(c.now) {
		c.mu.Unlock()
		return ctx.Err()
	}
	s := &handSleeper{at: t, wake: make(chan struct{})}
	c.sleepers = append(c.sleepers, s)
	c.mu.Unlock()
	select {
	case <-s.wake:
		return nil
	case <-ctx.Done():
		c.mu.Lock()
		if i := slices.Index(c.sleepers, s); i >= 0 {
			c.sleepers = slices.Delete(c.sleepers, i, i+1)
		}
		c.mu.Unlock()
		return ctx.Err()
	}
}

// step waits until the engine sleeps out a step, moves the clock to that step's end and returns
// the step's time.
func (c *handClock) step(t *testing.T) time.Duration {
	t.Helper()
	var at, from time.Time
	eventually(t, "the engine to run a step", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		if len(c.sleepers) != 1 { // only the step loop sleeps on this clock here
			return false
		}
		at, from = c.sleepers[0].at, c.now
		return true
	})
	c.mu.Lock()
	c.now = at
	close(c.sleepers[0].wake)
	c.sleepers = c.sleepers[:0]
	c.mu.Unlock()
	return at.Sub(from)
}

// startEngineClock is startEngine with the steps on clk.
func startEngineClock(t *testing.T, cfg Config, clk clock) *testEngine {
	t.Helper()
	cache := local.NewRadixTree(local.Options{})
	reg := prometheus.NewRegistry()
	e, err := New(cfg, cache, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	e.clk = clk // before Start: the step loop reads it from its first step
	if err := e.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(e.Handler())
	t.Cleanup(srv.Close)
	t.Cleanup(e.Close)
	return &testEngine{Engine: e, srv: srv, cache: cache, reg: reg}
}

// tokenStream reads an SSE completion stream in the background and hands over its text
// chunks one by one, so that a test can take each token when it expects it.
type tokenStream struct {
	texts chan string // closed at [DONE] or when the stream breaks
}

func newTokenStream(body io.ReadCloser) *tokenStream {
	s := &tokenStream{texts: make(chan string, 64)}
	go func() {
		defer close(s.texts)
		defer body.Close()
		r := bufio.NewReader(body)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			p, ok := strings.CutPrefix(strings.TrimSpace(line), "data: ")
			if !ok || p == "[DONE]" {
				continue
			}
			var c response
			if json.Unmarshal([]byte(p), &c) == nil && len(c.Choices) == 1 && c.Choices[0].Text != nil && *c.Choices[0].Text != "" {
				s.texts <- *c.Choices[0].Text
			}
		}
	}()
	return s
}

// next waits for the stream's next token (at most 10 s: the engine is stepping by hand).
func (s *tokenStream) next(t *testing.T, what string) {
	t.Helper()
	select {
	case _, ok := <-s.texts:
		if !ok {
			t.Fatalf("%s: the stream ended", what)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no token", what)
	}
}

// ended checks that the stream has no more tokens.
func (s *tokenStream) ended(t *testing.T, what string) {
	t.Helper()
	select {
	case txt, ok := <-s.texts:
		if ok {
			t.Fatalf("%s: unexpected token %q", what, txt)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: the stream did not end", what)
	}
}

// ttftSum is the ttft_seconds histogram's count and sum.
func ttftSum(t *testing.T, te *testEngine) (uint64, float64) {
	t.Helper()
	mfs, err := te.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "prefixmesh_simengine_ttft_seconds" {
			h := mf.GetMetric()[0].GetHistogram()
			return h.GetSampleCount(), h.GetSampleSum()
		}
	}
	t.Fatal("no ttft_seconds histogram")
	return 0, 0
}

// A long prompt arriving while a stream decodes slows that stream by exactly the step model's
// mixed steps (prefill-decode interference), and a request's TTFT is the time of the steps its
// prompt's chunks ran in. The rates make the model round: PrefillTokensPerSec 1,000 gives 1 ms a
// prompt token and a decode sequence (kvpool.FromCosts), DecodeTokensPerSec 50 a 20 ms
// decode-only step of 16 sequences, so Fixed = 20 − 16 × 1 = 4 ms; the budget is 100 tokens.
// Hence a step of p prompt tokens and d decoding sequences takes 4 + p + d ms:
//
//   - A, 10 prompt tokens, 12 output tokens, alone: its prompt runs in one step, 4 + 10 = 14 ms
//     (its TTFT), then it decodes alone in 4 + 1 = 5 ms steps;
//   - B, 250 prompt tokens, arrives while A decodes: it is admitted when A's step ends (5 ms
//     later), and its prompt runs in chunks of 99, 99 and 52 tokens beside A's token: steps of
//     4 + 99 + 1 = 104, 104 and 4 + 52 + 1 = 57 ms, so B's TTFT is 5 + 104 + 104 + 57 = 270 ms
//     and A's inter-token gaps stretch from 5 ms to 104, 104 and 57 ms; then both decode,
//     4 + 2 = 6 ms a step, until B's second and last token;
//   - C, 250 prompt tokens on the idle engine: 104 + 104 + 4 + 50 = 262 ms to its first token,
//     kvpool.Step.PrefillAlone(250).
func TestPrefillStretchesDecodeSteps(t *testing.T) {
	const ms = time.Millisecond
	cfg := fastConfig()
	cfg.PrefillTokensPerSec, cfg.DecodeTokensPerSec, cfg.TokenBudget = 1000, 50, 100
	clk := &handClock{now: time.Unix(1_700_000_000, 0)}
	te := startEngineClock(t, cfg, clk)
	if s := te.step; s.Fixed.Round(time.Microsecond) != 4*ms || math.Abs(s.PerPrefillToken-1e-3) > 1e-12 ||
		math.Abs(s.PerDecodeSeq-1e-3) > 1e-12 || s.TokenBudget != 100 {
		t.Fatalf("step model %+v, want 4 ms fixed, 1 ms a prompt token and a decode sequence, budget 100", s)
	}
	// Durations computed in float seconds land within a nanosecond or so of the round values.
	near := func(got, want time.Duration) bool { return (got - want).Abs() <= time.Microsecond }
	lastTTFT := func() func() time.Duration {
		var n0 uint64
		var s0 float64
		return func() time.Duration {
			n, s := ttftSum(t, te)
			if n != n0+1 {
				t.Fatalf("ttft_seconds has %d samples, want %d", n, n0+1)
			}
			d := time.Duration((s - s0) * float64(time.Second))
			n0, s0 = n, s
			return d
		}
	}()

	var steps []time.Duration // as the engine asked for them
	step := func() { steps = append(steps, clk.step(t)) }

	a := newTokenStream(te.openStream(t, t.Context(), "/v1/completions",
		map[string]any{"prompt": tokenPrompt(10, 1), "max_tokens": 12, "stream": true}).Body)
	var aTimes []time.Time
	tokA := func() { a.next(t, "A"); aTimes = append(aTimes, clk.Now()) }
	step()
	tokA()
	if got := lastTTFT(); !near(got, 14*ms) {
		t.Fatalf("A's TTFT %v, want 14 ms (one step of its 10 prompt tokens)", got)
	}
	step()
	tokA()
	step()
	tokA()

	// B arrives while A's next decode step runs; it is admitted when that step ends.
	type opened struct {
		resp *http.Response
		err  error
	}
	bOpen := make(chan opened, 1)
	go func() {
		body, _ := json.Marshal(map[string]any{"prompt": tokenPrompt(250, 10000), "max_tokens": 2, "stream": true})
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, te.srv.URL+"/v1/completions", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		bOpen <- opened{resp, err}
	}()
	eventually(t, "B to queue", func() bool { return te.Load().Waiting == 1 })
	bArrival := clk.Now()
	step() // A's decode step under way when B came
	tokA()
	var b *tokenStream
	select {
	case o := <-bOpen:
		if o.err != nil || o.resp.StatusCode != http.StatusOK {
			t.Fatalf("B: %v %v", o.resp, o.err)
		}
		b = newTokenStream(o.resp.Body)
	case <-time.After(10 * time.Second):
		t.Fatal("B was not admitted")
	}
	for range 3 { // B's three chunks, each beside one of A's tokens
		step()
		tokA()
	}
	b.next(t, "B's first token")
	if got := lastTTFT(); !near(got, 270*ms) || !near(clk.Now().Sub(bArrival), 270*ms) {
		t.Fatalf("B's TTFT %v (clock %v), want 270 ms: 5 waiting for A's step, then 104 + 104 + 57", got, clk.Now().Sub(bArrival))
	}
	step() // both decode
	tokA()
	b.next(t, "B's second token")
	b.ended(t, "B")
	for len(aTimes) < 12 {
		step()
		tokA()
	}
	a.ended(t, "A")

	wantSteps := []time.Duration{14 * ms, 5 * ms, 5 * ms, 5 * ms, 104 * ms, 104 * ms, 57 * ms, 6 * ms, 5 * ms, 5 * ms, 5 * ms, 5 * ms}
	var gaps []time.Duration
	for i := 1; i < len(aTimes); i++ {
		gaps = append(gaps, aTimes[i].Sub(aTimes[i-1]))
	}
	if !slices.EqualFunc(steps, wantSteps, near) || !slices.EqualFunc(gaps, wantSteps[1:], near) {
		t.Fatalf("steps %v and A's inter-token gaps %v, want steps %v", steps, gaps, wantSteps)
	}

	// C alone: its TTFT is the steps of its three chunks, nothing else.
	c := newTokenStream(te.openStream(t, t.Context(), "/v1/completions",
		map[string]any{"prompt": tokenPrompt(250, 20000), "max_tokens": 1, "stream": true}).Body)
	var cSteps time.Duration
	for range 3 {
		cSteps += clk.step(t)
	}
	c.next(t, "C's token")
	c.ended(t, "C")
	if want := te.step.PrefillAlone(250); !near(want, 262*ms) || !near(cSteps, want) || !near(lastTTFT(), want) {
		t.Fatalf("C: steps %v, want PrefillAlone(250) %v = 262 ms, also its TTFT", cSteps, want)
	}
	te.checkDrained(t)
}
