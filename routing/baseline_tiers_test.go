package routing

import (
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/prefixmesh/prefixmesh/local"
)

// tierCase is one two- or three-node fleet: each node's GPU match and lower-tier run in blocks of
// 16 tokens, and the scores worked by hand from the upstream formula (lower is better, as in a
// Decision).
type tierCase struct {
	name     string
	gpu      []int        // GPU blocks per node
	tiers    []TierTokens // lower-tier blocks per node (converted to tokens); nil: Request.Tiers nil
	setup    func(nodes []NodeInfo)
	want     int       // chosen node
	wantCost []float64 // each candidate's Score
}

func runTierCases(t *testing.T, policy string, promptBlocks int, cases []tierCase) {
	t.Helper()
	p := mustPolicy(t, policy, DefaultPolicyConfig())
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			nodes := fleetInfo(len(tc.gpu))
			if tc.setup != nil {
				tc.setup(nodes)
			}
			matched := make([]int, len(tc.gpu))
			for i, b := range tc.gpu {
				matched[i] = b * 16
			}
			req := &Request{Hashes: chainOf(3, promptBlocks), PromptTokens: promptBlocks * 16, BlockSize: 16}
			for _, blocks := range tc.tiers {
				for k := range blocks {
					blocks[k] *= 16
				}
				req.Tiers = append(req.Tiers, blocks)
			}
			d := choose(t, p, req, nodes, matched)
			for i, want := range tc.wantCost {
				if got := d.Candidates[i].Score; math.Abs(got-want) > 1e-9 {
					t.Errorf("node %d: score %v, want %v", i, got, want)
				}
			}
			if d.Node != tc.want {
				t.Errorf("chose node %d, want %d (%+v)", d.Node, tc.want, d.Candidates)
			}
			if d.MatchedTokens != matched[d.Node] {
				t.Errorf("decision matched %d, want the GPU match %d", d.MatchedTokens, matched[d.Node])
			}
		})
	}
}

func onCPU(b int) TierTokens     { return TierTokens{local.TierCPU: b} }
func onDisk(b int) TierTokens    { return TierTokens{local.TierDisk: b} }
func onStorage(b int) TierTokens { return TierTokens{local.TierStorage: b} }
func onRemote(b int) TierTokens  { return TierTokens{local.TierRemote: b} }

// Dynamo's tier-aware cost (ai-dynamo/dynamo lib/kv-router/src/scheduling/selector.rs,
// worker_logit): credit = device + 0.75 host + 0.25 disk + 0.5 shared blocks, prefill =
// max(request − credit, 0), cost = prefill + decode blocks (in flight + the request's blocks not on
// the GPU). A 32-block prompt; node 1 holds 16 GPU blocks with 20 blocks in flight:
// (32 − 16) + 20 + (32 − 16) = 52. Node 0 is idle and holds a lower-tier run.
func TestDynamoCostTierWeights(t *testing.T) {
	busyGPU := func(nodes []NodeInfo) { nodes[1].InFlightTokens, nodes[1].InFlight = 20*16, 1 }
	runTierCases(t, PolicyDynamoCost, 32, []tierCase{
		// 24 CPU: credit 0.75 × 24 = 18, (32 − 18) + 0 + 32 = 46 < 52.
		{name: "host 0.75", gpu: []int{0, 16}, tiers: []TierTokens{onCPU(24), {}}, setup: busyGPU, want: 0, wantCost: []float64{46, 52}},
		// 24 disk: credit 0.25 × 24 = 6, (32 − 6) + 32 = 58 > 52.
		{name: "disk 0.25", gpu: []int{0, 16}, tiers: []TierTokens{onDisk(24), {}}, setup: busyGPU, want: 1, wantCost: []float64{58, 52}},
		// vLLM's STORAGE medium is Dynamo's Disk tier: the same 58.
		{name: "local storage is disk", gpu: []int{0, 16}, tiers: []TierTokens{onStorage(24), {}}, setup: busyGPU, want: 1, wantCost: []float64{58, 52}},
		// 26 in a shared pool: credit 0.5 × 26 = 13, (32 − 13) + 32 = 51 < 52.
		{name: "shared 0.5", gpu: []int{0, 16}, tiers: []TierTokens{onRemote(26), {}}, setup: busyGPU, want: 0, wantCost: []float64{51, 52}},
		// 4 GPU then 20 CPU: credit 4 + 15 = 19, (32 − 19) + (32 − 4) = 41.
		{name: "gpu then host", gpu: []int{4, 16}, tiers: []TierTokens{onCPU(20), {}}, setup: busyGPU, want: 0, wantCost: []float64{41, 52}},
		// Without tiers (GPU-only, the cost as before): (32 − 0) + 32 = 64 > 52.
		{name: "no tiers", gpu: []int{0, 16}, setup: busyGPU, want: 1, wantCost: []float64{64, 52}},
	})
}

// llm-d's default precise profile (llm-d/llm-d-inference-scheduler
// deploy/config/epp-precise-prefix-cache-config.yaml): 2 × prefix + 1 × (1 − KV usage) + 1 × queue,
// highest wins. prefix: blocks weighted gpu 1.0, cpu 0.8, unlisted media 1.0
// (llm-d/llm-d-kv-cache pkg/kvcache/backend.go, kvblock_scorer.go), min-max normalised over the
// nodes that matched (pkg/plugins/scorer/utils.go); queue: (max − waiting)/(max − min), 1 when all
// equal (gateway-api-inference-extension queue.go). fleetInfo's nodes are empty (usage 0) with no
// queue, so an idle node's load part is 1 + 1 = 2.
func TestLLMDTierWeights(t *testing.T) {
	runTierCases(t, PolicyLLMD, 32, []tierCase{
		// 11 CPU = 8.8 against 8 GPU = 8: normalised 1 and 0, so 2 + 2 = 4 against 0 + 2 = 2.
		{name: "cpu 0.8 wins", gpu: []int{0, 8}, tiers: []TierTokens{onCPU(11), {}}, want: 0, wantCost: []float64{-4, -2}},
		// 9 CPU = 7.2 against 8: 0 + 2 = 2 against 2 + 2 = 4.
		{name: "cpu 0.8 loses", gpu: []int{0, 8}, tiers: []TierTokens{onCPU(9), {}}, want: 1, wantCost: []float64{-2, -4}},
		// Disk is not in llm-d's default media, so it weighs 1.0: 9 > 8.
		{name: "unlisted disk weighs 1", gpu: []int{0, 8}, tiers: []TierTokens{onDisk(9), {}}, want: 0, wantCost: []float64{-4, -2}},
		// Without tiers node 0 matched nothing: it scores 0 and node 1, the only match, 1.
		{name: "no tiers", gpu: []int{0, 8}, want: 1, wantCost: []float64{-2, -4}},
		// Three nodes: 8.8, 8 and 4 matched, normalised over [4, 8.8]: 1, 4/4.8, 0. Waiting 4, 0,
		// 2: queue 0, 1, 0.5. Free 0, 1000, 500 of 1000: 1 − usage 0, 1, 0.5. Sums: 2,
		// 2 × 5/6 + 2 = 11/3, 1.
		{name: "normalised over matched, with load", gpu: []int{0, 8, 4}, tiers: []TierTokens{onCPU(11), {}, {}},
			setup: func(nodes []NodeInfo) {
				nodes[0].Waiting, nodes[0].FreeBlocks = 4, 0
				nodes[2].Waiting, nodes[2].FreeBlocks = 2, 500
			},
			want: 1, wantCost: []float64{-2, -11.0 / 3, -1}},
	})
}

// The example of 10 CPU blocks against 8 GPU blocks, a 16-block prompt, idle nodes. Dynamo:
// node 0 (16 − 0.75 × 10) + 16 = 24.5, node 1 (16 − 8) + (16 − 8) = 16: the GPU node. llm-d:
// 10 × 0.8 = 8 = 8, both normalise to 1, so both score 2 + 1 + 1 = 4 and rendezvous decides;
// at 11 CPU blocks llm-d takes the CPU node (8.8 > 8) where Dynamo still does not:
// (16 − 8.25) + 16 = 23.75 > 16.
func TestTenCPUAgainstEightGPU(t *testing.T) {
	runTierCases(t, PolicyDynamoCost, 16, []tierCase{
		{name: "dynamo 10", gpu: []int{0, 8}, tiers: []TierTokens{onCPU(10), {}}, want: 1, wantCost: []float64{24.5, 16}},
		{name: "dynamo 11", gpu: []int{0, 8}, tiers: []TierTokens{onCPU(11), {}}, want: 1, wantCost: []float64{23.75, 16}},
	})
	runTierCases(t, PolicyLLMD, 16, []tierCase{
		{name: "llm-d 11", gpu: []int{0, 8}, tiers: []TierTokens{onCPU(11), {}}, want: 0, wantCost: []float64{-4, -2}},
	})
	p := mustPolicy(t, PolicyLLMD, DefaultPolicyConfig())
	req := &Request{Hashes: chainOf(3, 16), PromptTokens: 256, BlockSize: 16, Tiers: []TierTokens{onCPU(160), {}}}
	d := choose(t, p, req, fleetInfo(2), []int{0, 128})
	if d.Candidates[0].Score != -4 || d.Candidates[1].Score != -4 {
		t.Fatalf("llm-d 10 CPU against 8 GPU: %+v, want a tie at -4", d.Candidates)
	}
}

// Request.Tiers nil and Request.Tiers all zero are the same request to every policy: the tiers
// only ever add credit.
func TestNoTiersIsGPUOnly(t *testing.T) {
	nodes := fleetInfo(8)
	matched := make([]int, 8)
	for i := range nodes {
		matched[i] = (i * 5 % 8) * 16
		nodes[i].InFlight, nodes[i].InFlightTokens, nodes[i].Waiting = i%3, (i%3)*300, i%4
		nodes[i].FreeBlocks = 1000 - 100*i
	}
	for _, name := range PolicyNames() {
		if name == PolicyRoundRobin {
			continue // stateful: two calls answer differently by design
		}
		p := mustPolicy(t, name, DefaultPolicyConfig())
		for k := uint64(1); k <= 50; k++ {
			req := &Request{Hashes: chainOf(k, 16), PromptTokens: 256, BlockSize: 16}
			a := choose(t, p, req, nodes, matched)
			req.Tiers = make([]TierTokens, len(nodes))
			b := choose(t, p, req, nodes, matched)
			if a.Node != b.Node || !slices.Equal(a.Candidates, b.Candidates) {
				t.Fatalf("%s: nil tiers %+v, zero tiers %+v", name, a, b)
			}
		}
	}
}

func TestTierWeightsValidate(t *testing.T) {
	for _, bad := range []func(*PolicyConfig){
		func(c *PolicyConfig) { c.DynamoHostCacheHitWeight = 1.5 },
		func(c *PolicyConfig) { c.DynamoDiskCacheHitWeight = -0.1 },
		func(c *PolicyConfig) { c.DynamoSharedCacheMultiplier = math.NaN() },
		func(c *PolicyConfig) { c.LLMDTierWeights[local.TierCPU] = math.Inf(1) },
		func(c *PolicyConfig) { c.LLMDQueueWeight = -1 },
	} {
		cfg := DefaultPolicyConfig()
		bad(&cfg)
		if err := cfg.Validate(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: %v", cfg, err)
		}
	}
}
