package routing

import (
	"fmt"
	"github.com/prefixmesh/prefixmesh/local"
	"math"
	"time"
)

// NodeInfo is the router's view of one candidate node at decision time.
type NodeInfo struct {
	ID       string
	Alive    bool
	Draining bool
	// Role is the part of inference the node serves under prefill/decode disaggregation
	// (RoleBoth for an aggregated node).
	Role Role
	// Cold: the node's summary may hold blocks its engine no longer has (cluster.Meta.Cold: a
	// mirror restored from a checkpoint whose gap is not settled yet), so it may over-estimate.
	// Decider.Decide counts its matched tokens as 0, so prefix affinity never leans on it; it
	// still takes load. A partial mirror (a lower bound) is not cold.
	Cold  bool
	Model string
	// PrefillTokensPerSec is the node's uncached prefill throughput; 0 means unknown
	// (PolicyConfig.DefaultPrefillTokensPerSec is used).
	PrefillTokensPerSec float64
	// QueuedPrefillTokens, Running, Waiting and FreeBlocks are node-reported, LoadAge old.
	QueuedPrefillTokens int
	Running, Waiting    int
	FreeBlocks          int
	CapacityBlocks      int
	LoadAge             time.Duration
	// InFlight is the number of this router's own requests to the node not yet completed.
	InFlight int
	// InFlightTokens is the total prompt tokens of this router's own in-flight requests to the
	// node (until they complete): the KV footprint Dynamo's router tracks as "active blocks".
	// 0 when the caller does not track it.
	InFlightTokens int
	// InFlightPrefillTokens is the uncached prefill work (prompt − estimated matched tokens) of
	// this router's own requests to the node that have not produced a first token yet. It is
	// fresh where QueuedPrefillTokens is LoadAge old, so the cost model takes the larger of the
	// two. 0 when the caller does not track it.
	InFlightPrefillTokens int
	BlockSize             int
	// TTFT is what the router has learned of the node's time to first token (ttft.go); the
	// Decider fills it from its own requests' first tokens, overwriting what the caller set.
	TTFT TTFTFit
	// TierLoad is what the router has learned of the node's load cost per lower tier, as
	// PolicyConfig.TierLoadCost states it; 0 where nothing is learned (the configured prior
	// applies). The Decider fills it.
	TierLoad [local.NumTiers]float64
}

// Role is the part of inference a node serves (the node agent's --role).
type Role uint8

// Roles. A node of an older release announces none and is RoleBoth.
const (
	RoleBoth    Role = iota // prefills and decodes whole requests
	RolePrefill             // runs prefill legs only (vLLM kv_producer, an llm-d prefill pod)
	RoleDecode              // decodes, pulling or receiving the prompt's KV
)

// Request is what a policy knows about the request being routed.
type Request struct {
	Hashes       []uint64 // canonical block hashes of the prompt (local.AppendBlockHashes)
	PromptTokens int
	AdapterID    uint64
	Model        string
	SessionKey   uint64 // 0 = none
	BlockSize    int
	// Tiers, when not nil, holds per candidate (aligned with the nodes given to Choose) the
	// tokens its lower tiers add to its GPU match (TierTokens; the GPU entry is the match). The
	// Decider fills it from the index; nil means no tier holds anything beyond the GPU.
	Tiers []TierTokens
	// Concurrency is how many decisions other routers are expected to take, unseen, in the
	// same instant as this one (the Decider learns it: concurrency.go); 0 for one router and
	// for smooth traffic. prefixmesh spreads the request over the nodes such a burst would fill
	// when it is at least SpreadMinConcurrency.
	Concurrency float64
}

// Candidate is one node's line in a decision.
type Candidate struct {
	Node          int // index into the nodes slice
	MatchedTokens int
	// Score is the policy's cost for the node, lower is better (prefixmesh: expected TTFT in
	// seconds); +Inf for nodes a guard excluded.
	Score float64
	// Load is the node's load as the policy saw it (see Load).
	Load float64
}

// Decision is a policy's answer. Candidates is reused across calls when the caller reuses the
// Decision, so steady-state choices do not allocate.
type Decision struct {
	Node          int // index into the nodes slice
	MatchedTokens int
	Reason        string
	Candidates    []Candidate
}

// Policy chooses a node for a request. nodes are the eligible candidates (see Eligible);
// matchedTokens[i] is the estimated number of prompt tokens nodes[i] already caches (callers take
// max(index, overlay) × block size). Implementations are safe for concurrent use.
type Policy interface {
	Name() string
	Choose(req *Request, nodes []NodeInfo, matchedTokens []int, now time.Time, d *Decision) error
}

// Reasons reported in Decision.Reason.
const (
	ReasonMinTTFT       = "min-ttft"
	ReasonBurstSpread   = "min-ttft-burst-spread"
	ReasonSession       = "session-affinity"
	ReasonRoundRobin    = "round-robin"
	ReasonLeastLoaded   = "least-loaded"
	ReasonCHWBL         = "chwbl"
	ReasonLongestPrefix = "longest-prefix"
	ReasonSGLangCache   = "sglang-cache-hit"
	ReasonSGLangBalance = "sglang-imbalanced"
	ReasonSGLangLowHit  = "sglang-low-match"
	ReasonDynamoCost    = "dynamo-cost"
	ReasonLLMD          = "llm-d-score"
	ReasonOnlyCandidate = "only-candidate"
)

// Policy names, in the order PolicyNames returns them.
const (
	PolicyPrefixMesh    = "prefixmesh"
	PolicyRoundRobin    = "round-robin"
	PolicyLeastLoaded   = "least-loaded"
	PolicyCHWBL         = "chwbl"
	PolicyLongestPrefix = "longest-prefix"
	PolicySGLangGate    = "sglang-gate"
	PolicyDynamoCost    = "dynamo-cost"
	PolicyLLMD          = "llm-d"
)

// PolicyPrefixMeshGPU is prefixmesh ranking by the GPU prefix alone (PolicyConfig.IgnoreTiers
// set, whatever cfg says): the comparison that measures prefixmesh's tier credit (POLICIES.md,
// "Tiers"). NewPolicy accepts it, but it is not among PolicyNames: on a fleet without lower
// tiers it is prefixmesh, so only a caller with tiers to compare lists it.
const PolicyPrefixMeshGPU = "prefixmesh-gpu"

// prefixMeshGPU is prefixmesh under its own name (PolicyPrefixMeshGPU).
type prefixMeshGPU struct{ prefixMesh }

func (p *prefixMeshGPU) Name() string { return PolicyPrefixMeshGPU }

// PolicyNames returns the policies NewPolicy offers (it also accepts PolicyPrefixMeshGPU); the
// first is the default.
func PolicyNames() []string {
	return []string{PolicyPrefixMesh, PolicyRoundRobin, PolicyLeastLoaded, PolicyCHWBL,
		PolicyLongestPrefix, PolicySGLangGate, PolicyDynamoCost, PolicyLLMD}
}

// PolicyConfig holds every policy tunable. Fields a policy does not use are ignored by it.
type PolicyConfig struct {
	// LoadFactor is c of the bounded-load guard: no node may exceed ceil(c × mean load) after the
	// request is placed. 1.25 is the value Mirrokni et al. (2016) and the Vimeo/HAProxy
	// deployments of CHWBL use: a 25% margin over perfect balance keeps the expected number of
	// probes small while bounding the hottest node.
	LoadFactor float64
	// MinLoadBound raises the guard's per-node capacity to at least this many requests, so the
	// guard holds every node within max(c × mean + 1, MinLoadBound). At low load ceil(c × mean)
	// is 1–3 and, since load counts requests that are only decoding, the pure guard spreads a
	// prefix's requests over the fleet exactly when queues are short and locality is free: on
	// the Mooncake trace (8 nodes, mean in-flight ≈ 2, see POLICIES.md) the pure guard cut the hit
	// ratio from 98% to 65% of a pooled LRU and raised mean TTFT by a fifth. 8 keeps the guard
	// out of the way until a node has 8 requests in flight — far below an engine's batch limit
	// (vLLM's max_num_seqs is 256) — and beyond that it is the pure guard. 0 is the pure guard.
	MinLoadBound int
	// MissPenalty weighs the request's uncached prefill tokens again in prefixmesh's cost,
	// (queued + (1 + MissPenalty) × uncached) / rate. Pure expected TTFT (0) is myopic:
	// recomputing a prefix cached elsewhere delays every later request queued behind that work
	// and, by duplicating the prefix, evicts other prefixes, so later requests miss. On the
	// Mooncake trace a sweep over 0, 1, 3, 5, 10, 30 moved the hit ratio from 79% to 98.6% of a
	// pooled LRU with mean TTFT best between 3 and 10 and p99 within 6%; 10 is the smallest value
	// that keeps the hit ratio above 97% of pooled with margin. A node's queue still wins over
	// the cache once it exceeds 11 × the tokens the cache saves.
	MissPenalty float64
	// LoadAgeHalfLife discounts node-reported load by its age: a report this old counts half.
	// Nodes refresh load every 200 ms while it changes (cluster.Config.LoadInterval), so 1 s
	// means "five missed refreshes halve the weight"; the router's own in-flight count is never
	// discounted.
	LoadAgeHalfLife time.Duration
	// DefaultPrefillTokensPerSec is used for nodes that have not reported a prefill rate. 10,000
	// tokens/s is the order of a 7–13B model on one H100-class GPU; with homogeneous nodes only
	// ratios matter, so the exact value changes scores, not choices.
	DefaultPrefillTokensPerSec float64
	// SGLangBalanceAbs, SGLangBalanceRel and SGLangCacheThreshold are sgl-router's
	// balance_abs_threshold, balance_rel_threshold and cache_threshold (defaults of the
	// sgl-router README at the time of writing: 64, 1.5 and 0.3).
	SGLangBalanceAbs     int
	SGLangBalanceRel     float64
	SGLangCacheThreshold float64
	// DynamoOverlapWeight is Dynamo's kv-overlap-score-weight (default 1): the weight of prefill
	// blocks against decode blocks in the cost.
	DynamoOverlapWeight float64
	// DynamoHostCacheHitWeight, DynamoDiskCacheHitWeight and DynamoSharedCacheMultiplier are
	// what Dynamo's KV router credits a matched block on a lower tier, as a fraction of a GPU
	// block: host_cache_hit_weight 0.75 and disk_cache_hit_weight 0.25, each validated to [0, 1]
	// (ai-dynamo/dynamo lib/kv-router/src/scheduling/config.rs @0243c51), and
	// --shared-cache-multiplier 0.5, the frontend's value for a shared pool
	// (docs/components/router/router-offloading.md; the library default is 0, with no shared
	// cache). dynamo-cost credits CPU blocks with the host weight, disk and local storage
	// blocks with the disk weight (Dynamo indexes vLLM's STORAGE medium as its Disk tier) and
	// remote blocks with the shared multiplier.
	DynamoHostCacheHitWeight    float64
	DynamoDiskCacheHitWeight    float64
	DynamoSharedCacheMultiplier float64
	// LLMDTierWeights is what llm-d's precise prefix-cache scorer counts a matched block held on
	// each tier: gpu 1.0 and cpu 0.8 (llm-d/llm-d-kv-cache pkg/kvcache/backend.go,
	// DefaultKVCacheBackendConfig), and 1.0 for a medium the configuration does not list
	// (pkg/kvcache/kvblock_scorer.go, getMaxWeight), which by default is disk, storage and
	// remote.
	LLMDTierWeights [local.NumTiers]float64
	// LLMDPrefixWeight, LLMDKVCacheWeight and LLMDQueueWeight weigh the three scorers of llm-d's
	// default scheduling profile for precise prefix-cache routing: precise-prefix-cache-scorer
	// 2, kv-cache-utilization-scorer 1, queue-scorer 1 (llm-d/llm-d-inference-scheduler
	// deploy/config/epp-precise-prefix-cache-config.yaml @95f76e6; llm-d/llm-d
	// guides/precise-prefix-cache-aware uses the same).
	LLMDPrefixWeight, LLMDKVCacheWeight, LLMDQueueWeight float64
	// TierLoadCost is, per lower tier, the time to load one matched token from it as a fraction
	// of the time to prefill it on the same node: the prior a router starts from until it has
	// learned the node's own figure (TierLoad). A tier at 1 or more earns no credit (its
	// tokens count as uncached, and the slower load on top). [local.TierGPU] is unused.
	// Defaults, from published measurements: CPU 1/15 (vLLM's offloading connector on an
	// H100: ≈2.6 µs to load a token of an 8B model against ≈40 µs to prefill it, TTFT 2–22×
	// lower); disk and local storage 0.85 (SGLang HiCache's UCM file tier, 1,447 ms against
	// 1,725 ms recomputing an 8K prompt); remote 1.4 (its plain file tier, 2,450 ms: slower
	// than recomputing, so no credit until a node proves faster).
	TierLoadCost [local.NumTiers]float64
	// IgnoreTiers makes prefixmesh rank by the GPU prefix alone, as before tiers were known
	// (the simulator's GPU-only baseline); the estimate still reports them.
	IgnoreTiers bool
	// PeerPull lets the router name a KV source for a request: when another candidate holds a
	// longer run of the prompt than the chosen node and pulling it would reach the first token
	// sooner than recomputing it (PlanPeerPull, peerpull.go). On by default: a pull is planned
	// only where it shortens the chosen node's predicted TTFT, and a pull that fails falls back
	// to the recompute it replaced (the engine computes what it could not fetch). The router's
	// --peer-pull flag maps to it.
	PeerPull bool
	// DecodeStall weighs, in the P/D decision (PlanPrefill), the stall a local prefill puts into
	// the decode node's running sequences: with chunked prefill every step that carries the
	// prompt's chunks is longer by their compute, so each of the R sequences running there waits
	// about the prefill's time more for its tokens, and each request queued there waits as much
	// more for its own. The local side costs its TTFT plus DecodeStall × (the decode node's
	// sequences) × that time, the remote side its TTFT plus DecodeStall × (the prefill node's)
	// × its prefill time. 0 compares first tokens alone (a local prefill's cost to others is
	// then invisible, and a prefill pool sits idle while decode nodes queue); 1 counts a second
	// of another request's wait as a second of this one's. The default, 2, was chosen in the
	// simulator on the Azure code and conversation traces with 4 prefill and 4 decode nodes and
	// one router, where it kept mean TTFT below Dynamo's rule's and llm-d's while cutting ITL
	// p99 (against Dynamo's: below it on both at one router, not on Azure code at eight; the
	// tables in routing/POLICIES.md, "Disaggregation"); the estimate counts only the requests
	// there now, not those that arrive during the prefill, so a weight above 1 stands for them.
	DecodeStall float64
}

// DefaultPolicyConfig returns the defaults documented on each field.
func DefaultPolicyConfig() PolicyConfig {
	return PolicyConfig{
		LoadFactor:                  1.25,
		MinLoadBound:                8,
		MissPenalty:                 10,
		LoadAgeHalfLife:             time.Second,
		DefaultPrefillTokensPerSec:  10000,
		SGLangBalanceAbs:            64,
		SGLangBalanceRel:            1.5,
		SGLangCacheThreshold:        0.3,
		DynamoOverlapWeight:         1,
		DynamoHostCacheHitWeight:    0.75,
		DynamoDiskCacheHitWeight:    0.25,
		DynamoSharedCacheMultiplier: 0.5,
		LLMDTierWeights:             [local.NumTiers]float64{local.TierGPU: 1, local.TierCPU: 0.8, local.TierDisk: 1, local.TierStorage: 1, local.TierRemote: 1},
		LLMDPrefixWeight:            2,
		LLMDKVCacheWeight:           1,
		LLMDQueueWeight:             1,
		TierLoadCost:                [local.NumTiers]float64{local.TierCPU: 1.0 / 15, local.TierDisk: 0.85, local.TierStorage: 0.85, local.TierRemote: 1.4},
		PeerPull:                    true,
		DecodeStall:                 2,
	}
}

// Validate reports whether the configuration is usable.
func (c PolicyConfig) Validate() error {
	switch {
	case !(c.LoadFactor >= 1):
		return fmt.Errorf("policy config: LoadFactor %v must be >= 1: %w", c.LoadFactor, ErrInvalid)
	case c.MinLoadBound < 0:
		return fmt.Errorf("policy config: MinLoadBound %d must be >= 0: %w", c.MinLoadBound, ErrInvalid)
	case !(c.MissPenalty >= 0):
		return fmt.Errorf("policy config: MissPenalty %v must be >= 0: %w", c.MissPenalty, ErrInvalid)
	case !(c.DecodeStall >= 0) || math.IsInf(c.DecodeStall, 1):
		return fmt.Errorf("policy config: DecodeStall %v must be a finite number >= 0: %w", c.DecodeStall, ErrInvalid)
	case c.LoadAgeHalfLife <= 0:
		return fmt.Errorf("policy config: LoadAgeHalfLife %v must be positive: %w", c.LoadAgeHalfLife, ErrInvalid)
	case !(c.DefaultPrefillTokensPerSec > 0):
		return fmt.Errorf("policy config: DefaultPrefillTokensPerSec %v must be positive: %w", c.DefaultPrefillTokensPerSec, ErrInvalid)
	case c.SGLangBalanceAbs < 0 || !(c.SGLangBalanceRel >= 1):
		return fmt.Errorf("policy config: SGLang balance thresholds (%d, %v): %w", c.SGLangBalanceAbs, c.SGLangBalanceRel, ErrInvalid)
	case !(c.SGLangCacheThreshold >= 0 && c.SGLangCacheThreshold <= 1):
		return fmt.Errorf("policy config: SGLangCacheThreshold %v must be in [0,1]: %w", c.SGLangCacheThreshold, ErrInvalid)
	case !(c.DynamoOverlapWeight >= 0):
		return fmt.Errorf("policy config: DynamoOverlapWeight %v must be >= 0: %w", c.DynamoOverlapWeight, ErrInvalid)
	case !inUnit(c.DynamoHostCacheHitWeight) || !inUnit(c.DynamoDiskCacheHitWeight) || !inUnit(c.DynamoSharedCacheMultiplier):
		return fmt.Errorf("policy config: Dynamo tier weights (%v, %v, %v) must be in [0,1]: %w",
			c.DynamoHostCacheHitWeight, c.DynamoDiskCacheHitWeight, c.DynamoSharedCacheMultiplier, ErrInvalid)
	case !validWeights(c.LLMDTierWeights[:]...) || !validWeights(c.LLMDPrefixWeight, c.LLMDKVCacheWeight, c.LLMDQueueWeight):
		return fmt.Errorf("policy config: llm-d weights %v, (%v, %v, %v): each must be a finite number >= 0: %w",
			c.LLMDTierWeights, c.LLMDPrefixWeight, c.LLMDKVCacheWeight, c.LLMDQueueWeight, ErrInvalid)
	case !validTierCosts(c.TierLoadCost):
		return fmt.Errorf("policy config: TierLoadCost %v: each must be a finite number >= 0: %w", c.TierLoadCost, ErrInvalid)
	}
	return nil
}

// NewPolicy returns the named policy (one of PolicyNames) with cfg.
func NewPolicy(name string, cfg PolicyConfig) (Policy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	switch name {
	case PolicyPrefixMesh, "":
		return &prefixMesh{cfg: cfg}, nil
	case PolicyRoundRobin:
		return &roundRobin{cfg: cfg}, nil
	case PolicyLeastLoaded:
		return &leastLoaded{cfg: cfg}, nil
	case PolicyCHWBL:
		return &chwbl{cfg: cfg}, nil
	case PolicyLongestPrefix:
		return &longestPrefix{cfg: cfg}, nil
	case PolicySGLangGate:
		return &sglangGate{cfg: cfg}, nil
	case PolicyDynamoCost:
		return &dynamoCost{cfg: cfg}, nil
	case PolicyLLMD:
		return &llmdScore{cfg: cfg}, nil
	case PolicyPrefixMeshGPU:
		cfg.IgnoreTiers = true
		return &prefixMeshGPU{prefixMesh{cfg: cfg}}, nil
	}
	return nil, fmt.Errorf("new policy %q: %w", name, ErrUnknownPolicy)
}

// Eligibility is what keeps a node out of a request's candidates. Every door decides with it
// (gRPC Route, the HTTP front door and whatever calls the front door's picker), so that a node
// ejected, draining, dead, serving another model, outside an adapter's pins or already tried is
// never chosen by one door and avoided by another. A cold node stays eligible (the Decider gives
// it no affinity) and the per-node in-flight cap is the Decider's, applied to what is eligible.
//
// Eligible is one predicate evaluated once per node, each part in O(1), so listing n nodes costs
// O(n) whatever the request's constraints: sets that name many nodes (an adapter's pins, a
// gateway's subset hint) come as a membership test built once per request (NodeSet.Has), never as
// a list scanned per node (which made a pick over 1,000 nodes pinned to one cost 1,000 × 999
// comparisons).
type Eligibility struct {
	Model string // the base model; "" allows any
	// Prefill selects the nodes that may run a disaggregated request's prefill leg (role
	// prefill); otherwise the nodes that may serve a whole request or its decode leg (roles both
	// and decode), never a prefill-only node.
	Prefill bool
	// Allowed is the request's allowed set (an adapter's pins, a gateway's subset hint, or both
	// intersected); nil allows every node. It must answer in O(1): NodeSet.Has.
	Allowed func(id string) bool
	// Exclude lists the nodes this request has already tried: at most a few (a retry on the
	// next-best node), so a scan; a set of many nodes goes in Allowed.
	Exclude []string
	Ejected func(id string) bool // passive health's ejections; nil ejects none
}

// NodeSet is a set of node ids, built once per request in O(its size) so that membership is
// O(1) per node (Eligibility.Allowed). The zero value is an empty set.
type NodeSet struct{ m map[string]struct{} }

// NewNodeSet returns the set of ids.
func NewNodeSet(ids ...string) *NodeSet {
	s := &NodeSet{m: make(map[string]struct{}, len(ids))}
	for _, id := range ids {
		s.m[id] = struct{}{}
	}
	return s
}

// Add puts id in the set.
func (s *NodeSet) Add(id string) {
	if s.m == nil {
		s.m = make(map[string]struct{})
	}
	s.m[id] = struct{}{}
}

// Has reports whether id is in the set.
func (s *NodeSet) Has(id string) bool {
	_, ok := s.m[id]
	return ok
}

// Len is the number of ids in the set.
func (s *NodeSet) Len() int { return len(s.m) }

// Eligible reports whether n may serve the request.
func (e *Eligibility) Eligible(n *NodeInfo) bool {
	switch {
	case !n.Alive || n.Draining || (e.Model != "" && n.Model != e.Model):
		return false
	case (n.Role == RolePrefill) != e.Prefill:
		return false
	case e.Allowed != nil && !e.Allowed(n.ID):
		return false
	case e.Ejected != nil && e.Ejected(n.ID):
		return false
	}
	for _, x := range e.Exclude {
		if x == n.ID {
			return false
		}
	}
	return true
}

// Eligible returns the indices of nodes that may serve a request: alive, not draining, serving
// model (any model when model is ""), and allowed by the adapter's pins (allowed == nil allows
// all).
func Eligible(nodes []NodeInfo, model string, allowed func(id string) bool) []int {
	return AppendEligible(nil, nodes, &Eligibility{Model: model, Allowed: allowed})
}

// AppendEligible appends to dst the indices of nodes that e lets serve the request.
func AppendEligible(dst []int, nodes []NodeInfo, e *Eligibility) []int {
	for i := range nodes {
		if e.Eligible(&nodes[i]) {
			dst = append(dst, i)
		}
	}
	return dst
}

// checkInput validates the arguments every policy shares and resets d.
func checkInput(nodes []NodeInfo, matchedTokens []int, d *Decision) error {
	if len(nodes) == 0 {
		return ErrNoCandidates
	}
	if len(matchedTokens) < len(nodes) || d == nil {
		return ErrInvalid
	}
	d.Node, d.MatchedTokens, d.Reason = -1, 0, ""
	d.Candidates = d.Candidates[:0]
	return nil
}

// finish records the chosen node in d.
func finish(d *Decision, node int, matchedTokens []int, reason string) {
	d.Node, d.MatchedTokens, d.Reason = node, matchedTokens[node], reason
}

// Load is the number of requests the router believes are on node n: its own in-flight count, fresh,
// plus the node-reported running and waiting sequences beyond that count (other routers' and
// direct traffic), discounted by the report's age with the given half-life. A single router with a
// fresh report sees exactly its in-flight count; the discount keeps a stale burst elsewhere from
// pinning a node as "busy" for longer than the report deserves.
func Load(n *NodeInfo, halfLife time.Duration) float64 {
	own := float64(n.InFlight)
	extra := float64(n.Running+n.Waiting) - own
	if extra <= 0 {
		return own
	}
	return own + extra*ageWeight(n.LoadAge, halfLife)
}

func ageWeight(age, halfLife time.Duration) float64 {
	if age <= 0 || halfLife <= 0 {
		return 1
	}
	return math.Exp2(-float64(age) / float64(halfLife))
}

// loadBound is the bounded-load capacity for placing one more request on n nodes carrying total
// load: ceil(c × (total + 1) / n) (Mirrokni, Thorup and Zadimoghaddam, "Consistent Hashing with
// Bounded Loads", SODA 2018, arXiv:1608.01350, 2016), raised to minBound. A node is within the
// bound when its load + 1 <= the capacity.
func loadBound(total float64, n int, c float64, minBound int) float64 {
	b := math.Ceil(c*(total+1)/float64(n) - 1e-9)
	return math.Max(b, float64(minBound))
}

// fillCandidates resets d.Candidates to one line per node with its matched tokens and load, and
// returns the capacity of the bounded-load guard with factor c and floor minBound.
func fillCandidates(d *Decision, nodes []NodeInfo, matchedTokens []int, cfg *PolicyConfig, c float64, minBound int) float64 {
	total := 0.0
	for i := range nodes {
		l := Load(&nodes[i], cfg.LoadAgeHalfLife)
		total += l
		d.Candidates = append(d.Candidates, Candidate{Node: i, MatchedTokens: matchedTokens[i], Load: l})
	}
	return loadBound(total, len(nodes), c, minBound)
}

// within reports whether a node at load l may take one more request under capacity bound.
func within(l, bound float64) bool { return l+1 <= bound+1e-9 }
