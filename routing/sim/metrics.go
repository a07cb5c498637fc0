package sim

import (
	"math"
	"slices"
	"time"
)

// Result is one policy's outcome on a trace. Durations are in seconds so that the JSON is
// readable without units.
type Result struct {
	Name     string  `json:"name"`
	HitRatio float64 `json:"hit_ratio"`   // sum matched tokens (GPU and CPU tier) / sum prompt tokens
	TTFTMean float64 `json:"ttft_mean_s"` // arrival → end of prefill
	TTFTP50  float64 `json:"ttft_p50_s"`
	TTFTP99  float64 `json:"ttft_p99_s"`
	E2EMean  float64 `json:"e2e_mean_s"` // arrival → last token
	// Inter-token latency: every gap between two consecutive output tokens of a sequence, over
	// all sequences (as vLLM's benchmark_serving pools its ITLs), mean and nearest-rank p99.
	ITLMean            float64 `json:"itl_mean_s"`
	ITLP99             float64 `json:"itl_p99_s"`
	ImbalancePrefill   float64 `json:"imbalance_prefill"`    // max/mean per-node prefill tokens computed
	ImbalanceInFlight  float64 `json:"imbalance_inflight"`   // max/mean per-node peak in-flight requests
	EstimateExactShare float64 `json:"estimate_exact_share"` // estimate for the chosen node == actual match
	EstimateMAETokens  float64 `json:"estimate_mae_tokens"`  // mean |estimate − actual|
	// CPUHitRatio is the part of HitRatio loaded from the nodes' CPU tiers (Config.CPUBlocks);
	// absent without one.
	CPUHitRatio float64 `json:"cpu_hit_ratio,omitempty"`
	// Disaggregation (Config.PrefillNodes): the prefill nodes, the rule, and the share of
	// requests prefilled on a prefill node; absent on an aggregated fleet. Under it HitRatio and
	// the estimate are those of the node that computed the prompt (the prefill node for a remote
	// prefill), as the client's cached_tokens are the prefill leg's.
	PrefillNodes       int     `json:"prefill_nodes,omitempty"`
	Disaggregate       string  `json:"disaggregate,omitempty"`
	RemotePrefillShare float64 `json:"remote_prefill_share,omitempty"`
	// Peer pull (peerpull.go; absent when the routers never asked, e.g. PolicyConfig.PeerPull
	// off): the routers' PlanPeerPull answers by reason; the share of requests a pull was
	// planned for and that moved KV; pulled tokens over prompt tokens; tokens moved over
	// tokens planned (below 1: sources that had evicted, or not yet computed, the run); the mean
	// pull; the mean predicted saving of a planned pull (LocalTTFT − PullTTFT); and the share of
	// planned pulls whose source's own predicted TTFT was sooner still.
	PeerPullReasons      map[string]int `json:"peer_pull_reasons,omitempty"`
	PeerPullPlannedShare float64        `json:"peer_pull_planned_share,omitempty"`
	PeerPullShare        float64        `json:"peer_pull_share,omitempty"`
	PeerPullTokenShare   float64        `json:"peer_pull_token_share,omitempty"`
	PeerPullDelivered    float64        `json:"peer_pull_delivered,omitempty"`
	PeerPullMeanMs       float64        `json:"peer_pull_mean_ms,omitempty"`
	PeerPullSavingMs     float64        `json:"peer_pull_saving_ms,omitempty"`
	PeerPullHolderFaster float64        `json:"peer_pull_holder_faster,omitempty"`

	// Many routers (routing/POLICIES.md, "Many routers"): how many, whether they shared, and what the wire cost.
	Routers                      int     `json:"routers"`
	Sharing                      bool    `json:"sharing"`
	ShareBytesPerRouterPerSec    float64 `json:"share_bytes_per_router_per_s"`     // router → routers
	NodeGossipBytesPerNodePerSec float64 `json:"node_gossip_bytes_per_node_per_s"` // deltas and load, node → routers
	ShareMessages                int64   `json:"share_messages"`
	ShareLost                    int64   `json:"share_lost"`
	Repairs                      int     `json:"repairs"` // full-summary pulls after a gap, all routers
	// The burst stagger (routing.Decider.AdmissionWait): the share of requests whose router
	// waited its turn before deciding, and the mean wait over all requests (part of the TTFT).
	StaggeredShare float64 `json:"staggered_share"`
	StaggerMeanMs  float64 `json:"stagger_mean_ms"`

	// Not part of the JSON contract: detail for tables, plots and tests.
	Served   int       `json:"-"` // requests that produced a first token
	Rejected int       `json:"-"` // requests no node could ever hold (larger than its pool)
	TTFTs    []float64 `json:"-"` // sorted ascending, seconds
}

// Reference is what an unrouted cache would achieve on the same trace.
type Reference struct {
	PooledLRUHitRatio float64 `json:"pooled_lru_hit_ratio"` // one cache of nodes×blocks, LRU
	InfiniteHitRatio  float64 `json:"infinite_hit_ratio"`   // one cache that never evicts
}

// Percentile returns the nearest-rank p-th percentile (0 < p ≤ 100) of sorted ascending data:
// the smallest value with at least p% of the data at or below it. Empty data gives 0. It is
// the one percentile of the repository: the simulator's seconds and the load generator's
// durations.
func Percentile[T ~float64 | ~int64](sorted []T, p float64) T {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

// Imbalance returns max/mean of xs, 1 for all-equal, and 0 when every x is zero.
func Imbalance(xs []float64) float64 {
	var sum, hi float64
	for _, x := range xs {
		sum += x
		hi = max(hi, x)
	}
	if sum == 0 {
		return 0
	}
	return hi / (sum / float64(len(xs)))
}

// collector accumulates one run's measurements.
type collector struct {
	promptTokens, matchedTokens int64
	loadedTokens                int64 // of matchedTokens, loaded from a CPU tier
	ttft, e2e                   []float64
	estimates, exact            int
	absErr                      int64
	rejected                    int
	staggered                   int
	staggerWait                 time.Duration
	// itlN counts the inter-token gaps of each length: a step of length d gives every decoding
	// sequence in it one gap of d, so there are far fewer lengths than gaps.
	itlN   map[time.Duration]int64
	itlSum float64 // seconds, over all gaps
	pull   pullStats
	itlAll int64
}

// itl records n inter-token gaps of length d.
func (c *collector) itl(d time.Duration, n int) {
	if n <= 0 {
		return
	}
	if c.itlN == nil {
		c.itlN = make(map[time.Duration]int64)
	}
	c.itlN[d] += int64(n)
	c.itlSum += d.Seconds() * float64(n)
	c.itlAll += int64(n)
}

// itlPercentile is the nearest-rank p-th percentile of the recorded gaps, as Percentile over
// every gap would give it.
func (c *collector) itlPercentile(p float64) float64 {
	if c.itlAll == 0 {
		return 0
	}
	keys := make([]time.Duration, 0, len(c.itlN))
	for d := range c.itlN {
		keys = append(keys, d)
	}
	slices.Sort(keys)
	rank := min(max(int64(math.Ceil(p/100*float64(c.itlAll))), 1), c.itlAll)
	var seen int64
	for _, d := range keys {
		if seen += c.itlN[d]; seen >= rank {
			return d.Seconds()
		}
	}
	return keys[len(keys)-1].Seconds()
}

func (c *collector) estimate(est, actual int) {
	c.estimates++
	if est == actual {
		c.exact++
	}
	d := est - actual
	c.absErr += int64(max(d, -d))
}

func (c *collector) result(name string, prefill, peak []float64) Result {
	r := Result{Name: name, Served: len(c.ttft), Rejected: c.rejected}
	if c.promptTokens > 0 {
		r.HitRatio = float64(c.matchedTokens) / float64(c.promptTokens)
		r.CPUHitRatio = float64(c.loadedTokens) / float64(c.promptTokens)
	}
	r.TTFTs = slices.Clone(c.ttft)
	slices.Sort(r.TTFTs)
	r.TTFTMean = mean(r.TTFTs)
	r.TTFTP50 = Percentile(r.TTFTs, 50)
	r.TTFTP99 = Percentile(r.TTFTs, 99)
	r.E2EMean = mean(c.e2e)
	if c.itlAll > 0 {
		r.ITLMean = c.itlSum / float64(c.itlAll)
		r.ITLP99 = c.itlPercentile(99)
	}
	r.ImbalancePrefill = Imbalance(prefill)
	r.ImbalanceInFlight = Imbalance(peak)
	if n := len(c.ttft) + c.rejected; n > 0 {
		r.StaggeredShare = float64(c.staggered) / float64(n)
		r.StaggerMeanMs = float64(c.staggerWait) / float64(time.Millisecond) / float64(n)
	}
	c.pull.fill(&r, len(c.ttft)+c.rejected, c.promptTokens)
	if c.estimates > 0 {
		r.EstimateExactShare = float64(c.exact) / float64(c.estimates)
		r.EstimateMAETokens = float64(c.absErr) / float64(c.estimates)
	}
	return r
}

func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

func seconds(d time.Duration) float64 { return d.Seconds() }
