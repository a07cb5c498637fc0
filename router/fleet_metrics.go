package router

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixmesh/prefixmesh/local"
	"github.com/prefixmesh/prefixmesh/routing"
)

// FleetTier is the tier label of prefixmesh_router_node_blocks: the index counts a node's summary
// keys, its GPU blocks and one per copy on a lower tier (their tier keys look alike to it), so
// the gauge is every tier together; each tier's count is the node agent's own metric.
const FleetTier = "all"

// FleetSource is what the fleet collector reads at every scrape.
type FleetSource struct {
	// Mirror lists the nodes the router mirrors: *cluster.SummaryMirror.
	Mirror NodeStatusSource
	// Blocks answers the blocks the index holds for a node: *routing.Index.NodeState.
	Blocks func(node string) (epoch, seq uint64, blocks int, ok bool)
	// Ejected reports passive health's ejections (requests.Health; nil: none).
	Ejected func(node string) bool
	// Decider gives this router's own requests in flight and the decision totals.
	Decider *routing.Decider
	Now     func() time.Time // nil: time.Now
}

// FleetCollector exports the router's view of every node it mirrors, read at scrape time, so a
// node that left has no series: what `prefixmesh-router status` prints and the dashboard's
// per-node panels plot. It also exports the Decider's totals (routing.DecisionTotals).
type FleetCollector struct {
	src FleetSource

	info, blocks, capacity, running, waiting, free, queued, inflight, age *prometheus.Desc
	synced, draining, cold, ejected                                       *prometheus.Desc
	requests, prompt, matched, uniform, tiers                             *prometheus.Desc
}

// NewFleetCollector returns a collector over src.
func NewFleetCollector(src FleetSource) *FleetCollector {
	if src.Now == nil {
		src.Now = time.Now
	}
	node := []string{"node"}
	g := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("prefixmesh_router_"+name, help, labels, nil)
	}
	return &FleetCollector{src: src,
		info:     g("node_info", "1 for every node the router mirrors, with its model, serving role (prefill, decode, both) and KV connector (none, nixl, sglang).", "node", "model", "role", "kv_connector"),
		blocks:   g("node_blocks", "KV blocks the router's index holds for the node, by tier.", "node", "tier"),
		capacity: g("node_kv_capacity_blocks", "KV capacity the node announced, in blocks.", node...),
		running:  g("node_running", "Sequences running on the node, as it last reported.", node...),
		waiting:  g("node_waiting", "Sequences queued on the node, as it last reported.", node...),
		free:     g("node_free_blocks", "Free KV blocks on the node, as it last reported.", node...),
		queued:   g("node_queued_prefill_tokens", "Prompt tokens admitted or queued on the node and not yet prefilled, as it last reported.", node...),
		inflight: g("node_inflight", "This router's own requests in flight to the node.", node...),
		age:      g("node_report_age_seconds", "Time since the router received the node's last load and summary report.", node...),
		synced:   g("node_synced", "1 once the index has held a full summary of the node's current epoch.", node...),
		draining: g("node_draining", "1 while the node drains (no new requests).", node...),
		cold:     g("node_cold", "1 while the node's cache view may hold blocks its engine lost (routed by load only).", node...),
		ejected:  g("node_ejected", "1 while passive health keeps the node out of the candidates.", node...),
		requests: g("decided_requests_total", "Committed routing decisions, every door."),
		prompt:   g("decided_prompt_tokens_total", "Prompt tokens of the committed decisions."),
		matched:  g("decided_matched_tokens_total", "Estimated reused tokens on the chosen nodes (as the engines will report cached_tokens)."),
		uniform:  g("decided_uniform_matched_tokens_total", "Mean estimated reused tokens over each decision's candidates: what a cache-blind (round-robin or random) choice would reuse."),
		tiers:    g("decided_tier_tokens_total", "Estimated reused tokens on the chosen nodes by tier: the GPU prefixes, and what CPU, disk, storage and remote tiers added to them.", "tier"),
	}
}

// Describe implements prometheus.Collector.
func (c *FleetCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.info, c.blocks, c.capacity, c.running, c.waiting, c.free, c.queued, c.inflight,
		c.age, c.synced, c.draining, c.cold, c.ejected, c.requests, c.prompt, c.matched, c.uniform, c.tiers} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *FleetCollector) Collect(ch chan<- prometheus.Metric) {
	now := c.src.Now()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	for _, n := range c.src.Mirror.Nodes() {
		id := n.Meta.NodeID
		// A node older than roles gossips none and is "both" with connector "none": what it is.
		gauge(c.info, 1, id, n.Meta.Model, n.Meta.Serving.String(), n.Meta.KVConnector.String())
		if c.src.Blocks != nil {
			if _, _, blocks, ok := c.src.Blocks(id); ok {
				gauge(c.blocks, float64(blocks), id, FleetTier)
			}
		}
		gauge(c.capacity, float64(n.Meta.KVCapacity), id)
		gauge(c.running, float64(n.Load.Running), id)
		gauge(c.waiting, float64(n.Load.Waiting), id)
		gauge(c.free, float64(n.Load.FreeBlocks), id)
		gauge(c.queued, float64(n.Load.QueuedPrefillTokens), id)
		if c.src.Decider != nil {
			gauge(c.inflight, float64(c.src.Decider.OwnInFlight(id).Requests), id)
		}
		if !n.LoadRecv.IsZero() {
			gauge(c.age, max(0, now.Sub(n.LoadRecv).Seconds()), id)
		}
		gauge(c.synced, b2f(n.Synced), id)
		gauge(c.draining, b2f(n.Meta.Draining), id)
		gauge(c.cold, b2f(n.Meta.Cold), id)
		gauge(c.ejected, b2f(c.src.Ejected != nil && c.src.Ejected(id)), id)
	}
	if c.src.Decider != nil {
		t := c.src.Decider.Totals()
		counter := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
		}
		counter(c.requests, float64(t.Requests))
		counter(c.prompt, float64(t.PromptTokens))
		counter(c.matched, float64(t.MatchedTokens))
		counter(c.uniform, t.UniformMatchedTokens)
		for i, n := range t.TierTokens { // every tier, 0 included: a rate over it is never "no data"
			ch <- prometheus.MustNewConstMetric(c.tiers, prometheus.CounterValue, float64(n), local.Tier(i).String())
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

var _ prometheus.Collector = (*FleetCollector)(nil)
