package routing

import (
	"math"
	"testing"

	"github.com/prefixmesh/prefixmesh/local"
)

// The peer-pull decision, every prediction worked by hand from the rule in peerpull.go at the
// prior fit (TTFT = (queued + uncached) / 10,000 tokens/s, no overhead), the prior tier costs
// (CPU 1/15, remote 1.4) and the prior transfer (5 ms + n × 128 KiB / 25 GB/s = n × 5.24288 µs).
// The prompt is 8,192 tokens of 16-token blocks: a holder of all of it serves 8,176 (vLLM
// recomputes the last token, so the last block is never fetched).
func TestPlanPeerPull(t *testing.T) {
	const prompt = 8192
	xfer := func(n int) float64 { return 0.005 + float64(n)*5.24288e-6 }
	busy := NodeInfo{ID: "h", QueuedPrefillTokens: 200000} // 20 s of prefill queued on the holder
	idle := NodeInfo{ID: "c"}
	other := NodeInfo{ID: "o"}
	slow := TransferFit{Overhead: 0.005, SecPerToken: 200e-6, Samples: 1} // twice a token's prefill
	type node struct {
		info  NodeInfo
		gpu   int
		lower TierTokens
	}
	for _, c := range []struct {
		name     string
		disabled bool
		fit      TransferFit
		nodes    []node // the chosen node is the first
		source   int
		tokens   int
		matched  int
		reason   string
		local    float64
		pull     float64
		holder   float64
	}{
		// C idle and empty, H holds the whole prompt behind 20 s: C without the pull 0.8192 s;
		// with it 16 / 10,000 + transfer(8,176); H itself 20 s (nothing uncached).
		{name: "overloaded holder, cheap transfer",
			nodes:  []node{{idle, 0, TierTokens{}}, {other, 0, TierTokens{}}, {busy, prompt, TierTokens{}}},
			source: 2, tokens: 8176, matched: 8176, reason: PeerPullPullFaster,
			local: 0.8192, pull: 0.0016 + xfer(8176), holder: 20},
		// C holds 2,048, H 6,144: 4,096 pulled; C prefills 2,048 after it.
		{name: "partial run on both",
			nodes:  []node{{idle, 2048, TierTokens{}}, {busy, 6144, TierTokens{}}},
			source: 1, tokens: 4096, matched: 6144, reason: PeerPullPullFaster,
			local: 0.6144, pull: 0.2048 + xfer(4096), holder: (200000 + 2048) / 1e4},
		// The transfer takes 200 µs a token, twice the prefill: recompute, 0.8192 against
		// 0.0016 + 5 ms + 8,176 × 200 µs.
		{name: "transfer slower than recompute", fit: slow,
			nodes:  []node{{idle, 0, TierTokens{}}, {busy, prompt, TierTokens{}}},
			source: -1, matched: 0, reason: PeerPullLocalFast,
			local: 0.8192, pull: 0.0016 + 0.005 + 8176*200e-6, holder: 20},
		// One block more on H: 1.6 ms of prefill saved for 5 ms of transfer overhead.
		{name: "one block is not worth a transfer",
			nodes:  []node{{idle, 4096, TierTokens{}}, {busy, 4112, TierTokens{}}},
			source: -1, matched: 4096, reason: PeerPullLocalFast,
			local: 0.4096, pull: 0.4080 + xfer(16), holder: (200000 + 4080) / 1e4},
		// C holds as much as H: nothing to pull.
		{name: "chosen holds as much",
			nodes:  []node{{idle, 4096, TierTokens{}}, {busy, 4096, TierTokens{}}},
			source: -1, matched: 4096, reason: PeerPullNoHolder,
			local: 0.4096, pull: math.Inf(1), holder: math.Inf(1)},
		// C's 2,048 on GPU and 2,048 on CPU are as long a run as H's 4,096 on GPU; C without the
		// pull: 4,096 uncached and 2,048 / 15 of CPU load.
		{name: "chosen holds as much with its CPU tier",
			nodes:  []node{{idle, 2048, TierTokens{local.TierCPU: 2048}}, {busy, 4096, TierTokens{}}},
			source: -1, matched: 4096, reason: PeerPullNoHolder,
			local: (4096 + 2048.0/15) / 1e4, pull: math.Inf(1), holder: math.Inf(1)},
		{name: "disabled", disabled: true,
			nodes:  []node{{idle, 0, TierTokens{}}, {busy, prompt, TierTokens{}}},
			source: -1, matched: 0, reason: PeerPullDisabled,
			local: 0.8192, pull: math.Inf(1), holder: math.Inf(1)},
		// H holds 4,096 on CPU only (nothing on its GPU): its peer serves the CPU run.
		// H itself: 20 s + 4,096 uncached + 4,096 / 15 of load.
		{name: "holder on CPU only",
			nodes:  []node{{idle, 0, TierTokens{}}, {busy, 0, TierTokens{local.TierCPU: 4096}}},
			source: 1, tokens: 4096, matched: 4096, reason: PeerPullPullFaster,
			local: 0.8192, pull: 0.4096 + xfer(4096), holder: (200000 + 4096 + 4096.0/15) / 1e4},
		// H holds 4,096 on disk only: a peer does not serve its disk, so there is no holder.
		{name: "holder on disk only",
			nodes:  []node{{idle, 0, TierTokens{}}, {busy, 0, TierTokens{local.TierDisk: 4096}}},
			source: -1, matched: 0, reason: PeerPullNoHolder,
			local: 0.8192, pull: math.Inf(1), holder: math.Inf(1)},
		// H's run is 1,024 GPU, then CPU and disk in an order the index does not keep: only the
		// GPU prefix counts. H itself: 20 s + 8,192 − 1,024 − 2,048 (CPU and disk, both credited:
		// costs 1/15 and 0.85 < 1) uncached + 1,024 / 15 CPU load + 1,024 × 0.85 disk load.
		{name: "holder's CPU run mixed with disk",
			nodes:  []node{{idle, 0, TierTokens{}}, {busy, 1024, TierTokens{local.TierCPU: 1024, local.TierDisk: 1024}}},
			source: 1, tokens: 1024, matched: 1024, reason: PeerPullPullFaster,
			local: 0.8192, pull: 0.7168 + xfer(1024),
			holder: (200000 + 5120 + 1024.0/15 + 1024*0.85) / 1e4},
		// C's 2,048 on a remote store are loaded but not credited (cost 1.4: 0.4 × 2,048 on top
		// of recomputing them); the pull fetches past them, 8,176 − 2,048 = 6,128 tokens.
		{name: "chosen with an uncredited tier",
			nodes:  []node{{idle, 0, TierTokens{local.TierRemote: 2048}}, {busy, prompt, TierTokens{}}},
			source: 1, tokens: 6128, matched: 8176, reason: PeerPullPullFaster,
			local: (8192 + 0.4*2048) / 1e4, pull: (2064+0.4*2048)/1e4 + xfer(6128), holder: 20},
	} {
		cfg := DefaultPolicyConfig()
		cfg.PeerPull = !c.disabled
		in := &PeerPullInput{PromptTokens: prompt, BlockSize: 16, Transfer: c.fit}
		for _, n := range c.nodes {
			in.Nodes = append(in.Nodes, n.info)
			in.GPU = append(in.GPU, n.gpu)
			in.Lower = append(in.Lower, n.lower)
		}
		got := PlanPeerPull(in, &cfg)
		if got.Source != c.source || got.Tokens != c.tokens || got.MatchedTokens != c.matched || got.Reason != c.reason ||
			!near(got.LocalTTFT, c.local) || !near(got.PullTTFT, c.pull) || !near(got.HolderTTFT, c.holder) {
			t.Errorf("%s: %+v\nwant source %d tokens %d matched %d (%s), local %.6f pull %.6f holder %.6f",
				c.name, got, c.source, c.tokens, c.matched, c.reason, c.local, c.pull, c.holder)
		}
	}
}

// The source is the holder of the longest run; among equal runs the least loaded, then the
// lowest id; a cold node (its summary may over-state) and a node of another block size are
// never sources.
func TestPlanPeerPullSource(t *testing.T) {
	cfg := DefaultPolicyConfig()
	c := NodeInfo{ID: "c"}
	for _, tc := range []struct {
		name  string
		nodes []NodeInfo
		gpu   []int
		want  int
	}{
		{"longest run", []NodeInfo{c, {ID: "a"}, {ID: "b"}}, []int{0, 2048, 4096}, 2},
		{"equal runs: least loaded", []NodeInfo{c, {ID: "a", InFlight: 3}, {ID: "b", InFlight: 1}}, []int{0, 4096, 4096}, 2},
		{"equal runs and loads: lowest id", []NodeInfo{c, {ID: "b"}, {ID: "a"}}, []int{0, 4096, 4096}, 2},
		{"cold holder", []NodeInfo{c, {ID: "a", Cold: true}, {ID: "b"}}, []int{0, 8192, 2048}, 2},
		{"another block size", []NodeInfo{c, {ID: "a", BlockSize: 32}, {ID: "b"}}, []int{0, 8192, 2048}, 2},
	} {
		in := &PeerPullInput{PromptTokens: 8192, BlockSize: 16, Nodes: tc.nodes, GPU: tc.gpu}
		if got := PlanPeerPull(in, &cfg); got.Source != tc.want {
			t.Errorf("%s: source %d (%+v), want %d", tc.name, got.Source, got, tc.want)
		}
	}
}
