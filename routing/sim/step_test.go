package sim

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prefixmesh/prefixmesh/routing"
)

func readTrace(t *testing.T, jsonl string) *Trace {
	t.Helper()
	tr, err := ReadMooncake(strings.NewReader(jsonl), ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// One node with a 1,000-token budget at 10,000 prefill and 50 decode tokens/s: a step is
// 18.4 ms + 0.1 ms a token (kvpool.FromCosts). A (500 tokens, 3 more after the first) arrives
// at 0, B (1,500 tokens, 2 more) at 30 ms, during A's first step. By hand:
//
//	step 1  0     – 68.4   A prefills 500                 (18.4 + 50)   A's first token
//	step 2  68.4  – 186.8  A decodes, B's first 999 tokens (18.4 + 100)
//	step 3  186.8 – 255.4  A decodes, B's last 501         (18.4 + 50.2) B's first token
//	step 4  255.4 – 274.0  A decodes (its last), B decodes (18.4 + 0.2)
//	step 5  274.0 – 292.5  B decodes (its last)            (18.4 + 0.1)
//
// TTFT 68.4 and 225.4 ms; inter-token gaps 118.4, 68.6, 18.6 (A) and 18.6, 18.5 (B): mean
// 48.54 ms, p99 (nearest rank 5 of 5) 118.4 ms; end to end 274.0 and 262.5 ms.
func TestStepsByHand(t *testing.T) {
	tr := readTrace(t, `{"timestamp": 0, "input_length": 500, "output_length": 3, "hash_ids": [1]}
{"timestamp": 30, "input_length": 1500, "output_length": 2, "hash_ids": [2, 3, 4]}
`)
	cfg := DefaultConfig()
	cfg.Nodes, cfg.Delay, cfg.TokenBudget = 1, 0, 1000
	r, s := run(t, tr, routing.PolicyPrefixMesh, cfg)
	if len(r.TTFTs) != 2 || !near(r.TTFTs[0], 0.0684) || !near(r.TTFTs[1], 0.2254) {
		t.Fatalf("TTFTs %v, want 68.4 and 225.4 ms", r.TTFTs)
	}
	if !near(r.ITLMean, 0.04854) || !near(r.ITLP99, 0.1184) {
		t.Fatalf("ITL mean %v p99 %v, want 48.54 and 118.4 ms", r.ITLMean, r.ITLP99)
	}
	if !near(r.E2EMean, (0.274+0.2625)/2) {
		t.Fatalf("E2E mean %v, want 268.25 ms", r.E2EMean)
	}
	if st := s.nodes[0].pool.Stats(); st.Running != 0 {
		t.Fatalf("%d sequences left running", st.Running)
	}
	if err := s.nodes[0].pool.Check(); err != nil {
		t.Fatal(err)
	}
}

// A fully cached prompt still costs a step of one token (vLLM computes the last token for its
// logits): the same 512-token prompt twice, far apart, is 18.4 + 51.2 ms cold and 18.5 ms warm.
func TestCachedPromptCostsOneToken(t *testing.T) {
	tr := readTrace(t, `{"timestamp": 0, "input_length": 512, "output_length": 0, "hash_ids": [1]}
{"timestamp": 10000, "input_length": 512, "output_length": 0, "hash_ids": [1]}
`)
	cfg := DefaultConfig()
	cfg.Nodes, cfg.Delay = 1, 0
	r, _ := run(t, tr, routing.PolicyPrefixMesh, cfg)
	if !near(r.TTFTs[0], 0.0185) || !near(r.TTFTs[1], 0.0696) {
		t.Fatalf("TTFTs %v, want 18.5 ms warm and 69.6 ms cold", r.TTFTs)
	}
	if r.ITLMean != 0 || r.ITLP99 != 0 {
		t.Fatalf("ITL %v / %v without a second token", r.ITLMean, r.ITLP99)
	}
}

// The ITL percentile over counted gap lengths is Percentile over every gap.
func TestITLPercentileMatchesExpanded(t *testing.T) {
	var c collector
	var all []float64
	for i, n := range []int{5, 1, 90, 3, 1} {
		d := (7 - i) * 1000 // descending lengths, unsorted by count
		c.itl(secondsDur(d), n)
		for k := 0; k < n; k++ {
			all = append(all, secondsDur(d).Seconds())
		}
	}
	sortFloat(all)
	for _, p := range []float64{1, 50, 90, 99, 100} {
		if got, want := c.itlPercentile(p), Percentile(all, p); got != want {
			t.Fatalf("p%v: %v, want %v", p, got, want)
		}
	}
}

func secondsDur(us int) time.Duration { return time.Duration(us) * time.Microsecond }

func sortFloat(xs []float64) { slices.Sort(xs) }
