package routing

import (
	"math"
	"testing"

	"github.com/prefixmesh/prefixmesh/local"
)

// The P/D decision, with every prediction worked by hand at the prior fit (TTFT = (queued +
// uncached) / 10,000 tokens/s) and the prior transfer (5 ms + n × 128 KiB / 25 GB/s). Remote:
// the decode leg waits for the later of the prefill and D's queue (D's TTFT for one token), then
// the transfer.
func TestPlanPrefill(t *testing.T) {
	cfg := DefaultPolicyConfig()
	xfer := func(n int) float64 { return 0.005 + float64(n)*float64(128<<10)/25e9 }
	idle := NodeInfo{ID: "p0"}
	busyD := NodeInfo{ID: "d", QueuedPrefillTokens: 40000} // 4 s of prefill queued on the decode node
	for _, c := range []struct {
		name       string
		mode       DisaggMode
		decode     NodeInfo
		match      TierTokens
		prefill    []NodeInfo
		wantP      int
		wantReason string
		local      float64
		remote     float64
	}{
		// 8k uncached on an idle D: local 0.8 s; remote 0.8 s + transfer 5 ms + 8192 × 5.24 µs.
		{"idle decode node", DisaggAuto, NodeInfo{ID: "d"}, TierTokens{}, []NodeInfo{idle}, -1, PrefillLocalFaster, 0.8192, 0.8192 + xfer(8192)},
		// D queues 4 s: local 4.8192 s; remote waits out D's queue (4.0001 s) and moves 8192.
		{"busy decode node", DisaggAuto, busyD, TierTokens{}, []NodeInfo{idle}, 0, PrefillRemoteFaster, 4.8192, 4.0001 + xfer(8192)},
		// D holds all but one block: stay local whatever the queue.
		{"cached on decode", DisaggAuto, busyD, TierTokens{local.TierGPU: 8192 - 16}, []NodeInfo{idle}, -1, PrefillLocalCached, 4 + 16.0/10000, math.Inf(1)},
		// D holds 4096 on its CPU (credited at 1/15): uncached 4096 + load 4096/15.
		{"CPU tier on decode", DisaggAuto, busyD, TierTokens{local.TierCPU: 4096}, []NodeInfo{idle}, 0, PrefillRemoteFaster, (40000 + 4096 + 4096.0/15) / 10000, 4.0001 + xfer(4096)},
		{"never", DisaggNever, busyD, TierTokens{}, []NodeInfo{idle}, -1, PrefillLocalNever, 4.8192, math.Inf(1)},
		{"no prefill node", DisaggAuto, busyD, TierTokens{}, nil, -1, PrefillLocalNoNode, 4.8192, math.Inf(1)},
		{"always", DisaggAlways, NodeInfo{ID: "d"}, TierTokens{}, []NodeInfo{idle}, 0, PrefillRemoteAlways, 0.8192, 0.8192 + xfer(8192)},
	} {
		in := &PrefillInput{PromptTokens: 8192, BlockSize: 16, Decode: &c.decode, DecodeMatch: c.match, Prefill: c.prefill}
		got := PlanPrefill(in, c.mode, &cfg)
		if got.Prefill != c.wantP || got.Reason != c.wantReason || !near(got.LocalTTFT, c.local) || !near(got.RemoteTTFT, c.remote) {
			t.Errorf("%s: %+v, want prefill %d (%s), local %.4f remote %.4f", c.name, got, c.wantP, c.wantReason, c.local, c.remote)
		}
	}
}

func near(a, b float64) bool {
	if math.IsInf(a, 1) || math.IsInf(b, 1) {
		return a == b
	}
	return math.Abs(a-b) < 1e-9
}

// llm-d's rule counts the GPU only; Dynamo's weighs tiers and bypasses short or mostly cached
// prompts. The cases sit on each rule's edges, from the cited sources' constants.
func TestPlanPrefillBaselines(t *testing.T) {
	d := NodeInfo{ID: "d"}
	ps := []NodeInfo{{ID: "p0", QueuedPrefillTokens: 500}, {ID: "p1"}}
	in := func(prompt int, m TierTokens) *PrefillInput {
		return &PrefillInput{PromptTokens: prompt, BlockSize: 16, Decode: &d, DecodeMatch: m, Prefill: ps}
	}
	// llm-d, nonCached 512: 512 uncached disaggregates (to the idler p1), 511 does not; a CPU
	// hit does not count (unweighted GPU count).
	if p := PlanPrefillLLMD(in(1024, TierTokens{local.TierGPU: 512}), 512); p.Prefill != 1 {
		t.Errorf("llm-d 512 uncached: %+v", p)
	}
	if p := PlanPrefillLLMD(in(1024, TierTokens{local.TierGPU: 513}), 512); p.Prefill != -1 {
		t.Errorf("llm-d 511 uncached: %+v", p)
	}
	if p := PlanPrefillLLMD(in(1024, TierTokens{local.TierCPU: 1024}), 512); p.Prefill != 1 {
		t.Errorf("llm-d CPU hit: %+v", p)
	}
	if p := PlanPrefillLLMD(in(1024, TierTokens{}), 0); p.Prefill != -1 {
		t.Errorf("llm-d disabled: %+v", p)
	}
	// Dynamo isl_bounding, weights GPU 1, CPU 0.75: eff = prompt − weighted cached; stay local
	// iff eff < 2048 and eff/prompt < 0.7.
	w := [local.NumTiers]float64{1, 0.75, 0.25, 0.25, 0.5}
	for _, c := range []struct {
		prompt int
		m      TierTokens
		want   int
	}{
		{2000, TierTokens{}, 1},                     // eff 2000 < 2048 but 2000/2000 ≥ 0.7
		{4000, TierTokens{local.TierGPU: 2000}, -1}, // eff 2000, 0.5
		{4000, TierTokens{local.TierCPU: 2800}, -1}, // 2800 × 0.75 = 2100 cached: eff 1900, 0.475
		{4000, TierTokens{local.TierDisk: 2800}, 1}, // 2800 × 0.25 = 700: eff 3300
		{8000, TierTokens{local.TierGPU: 5000}, 1},  // eff 3000 ≥ 2048
	} {
		if p := PlanPrefillDynamo(in(c.prompt, c.m), w); p.Prefill != c.want {
			t.Errorf("dynamo %d %v: %+v, want prefill %d", c.prompt, c.m, p, c.want)
		}
	}
}

// The transfer learner moves from the prior (≈5.2 µs per token) to what transfers take: 2,000
// transfers of 10,000 tokens in 5 ms + 0.1 s (10 µs per token) leave it within the prior's
// shrinkage of 10 µs: (256 × 10 + 16 × 5.24) / 272 ≈ 9.72 µs.
func TestTransferLearner(t *testing.T) {
	var l TransferLearner
	if l.Fit() != DefaultTransfer {
		t.Fatal("prior")
	}
	for i := 0; i < 2000; i++ {
		l.Observe(10000, 0.105)
		l.Observe(0, 1)   // no tokens: ignored
		l.Observe(10, -1) // garbage: ignored
	}
	f := l.Fit()
	if got := f.SecPerToken * 1e6; got < 9.6 || got > 9.8 {
		t.Fatalf("learned %.3f µs/token, want ≈9.72", got)
	}
	if !near(f.Seconds(1000), 0.005+1000*f.SecPerToken) || f.Seconds(0) != 0 {
		t.Fatal("Seconds")
	}
}

// The decode stall: D idle of prefill but running 32 sequences. Comparing first tokens, its own
// prefill of 8192 tokens (0.8192 s) beats the remote one (0.8192 s and the transfer); counting
// the stall it puts into the 32 sequences' steps at weight 1 (32 × 0.8192 s), the remote wins.
// The prior fit's per-sequence term is 0, so D's TTFT does not move with its sequences.
func TestPlanPrefillDecodeStall(t *testing.T) {
	d := NodeInfo{ID: "d", Running: 32}
	for _, c := range []struct {
		weight float64
		wantP  int
		stall  float64
	}{{0, -1, 0}, {1, 0, 32 * 0.8192}, {0.01, 0, 0.01 * 32 * 0.8192}} {
		cfg := DefaultPolicyConfig()
		cfg.DecodeStall = c.weight
		in := &PrefillInput{PromptTokens: 8192, BlockSize: 16, Decode: &d, Prefill: []NodeInfo{{ID: "p0"}}}
		got := PlanPrefill(in, DisaggAuto, &cfg)
		if got.Prefill != c.wantP || !near(got.LocalStall, c.stall) || !near(got.LocalTTFT, 0.8192) {
			t.Errorf("weight %v: %+v, want prefill %d, stall %.4f", c.weight, got, c.wantP, c.stall)
		}
	}
	bad := DefaultPolicyConfig()
	bad.DecodeStall = -1
	if bad.Validate() == nil {
		t.Error("a negative DecodeStall validated")
	}
}
