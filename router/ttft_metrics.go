package router

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixmesh/prefixmesh/routing"
)

// TTFTCollector exports what a router has learned of each node's time to first token
// (routing.TTFTFit, routing/POLICIES.md, "Learning each node's TTFT"), read from the Decider at
// every scrape, so a node that left (its fit dropped) leaves no series behind.
type TTFTCollector struct {
	dec                               *routing.Decider
	scale, overhead, perSeq, samples  *prometheus.Desc
	fleetScale, fleetOver, fleetSeqDs *prometheus.Desc
}

// NewTTFTCollector returns a collector over dec's learned fits.
func NewTTFTCollector(dec *routing.Decider) *TTFTCollector {
	node := []string{"node"}
	return &TTFTCollector{dec: dec,
		scale:      prometheus.NewDesc("prefixmesh_router_ttft_fit_scale", "Learned prefill time per token of the node, as a multiple of its nominal rate (2: half as fast).", node, nil),
		overhead:   prometheus.NewDesc("prefixmesh_router_ttft_fit_overhead_seconds", "Learned time every request to the node waits beyond its prefill work.", node, nil),
		perSeq:     prometheus.NewDesc("prefixmesh_router_ttft_fit_per_seq_seconds", "Learned TTFT added per 32 sequences running on the node.", node, nil),
		samples:    prometheus.NewDesc("prefixmesh_router_ttft_fit_samples", "Effective (forgotten) first tokens behind the node's fit.", node, nil),
		fleetScale: prometheus.NewDesc("prefixmesh_router_ttft_fleet_scale", "Learned prefill time per token over all nodes, as a multiple of the nominal rate.", nil, nil),
		fleetOver:  prometheus.NewDesc("prefixmesh_router_ttft_fleet_overhead_seconds", "Learned overhead over all nodes.", nil, nil),
		fleetSeqDs: prometheus.NewDesc("prefixmesh_router_ttft_fleet_per_seq_seconds", "Learned TTFT per 32 running sequences over all nodes.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *TTFTCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.scale, c.overhead, c.perSeq, c.samples, c.fleetScale, c.fleetOver, c.fleetSeqDs} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *TTFTCollector) Collect(ch chan<- prometheus.Metric) {
	fits, fleet := c.dec.AppendLearnedTTFT(nil)
	for _, f := range fits {
		ch <- prometheus.MustNewConstMetric(c.scale, prometheus.GaugeValue, f.Fit.PrefillScale(), f.Node)
		ch <- prometheus.MustNewConstMetric(c.overhead, prometheus.GaugeValue, f.Fit.Overhead, f.Node)
		ch <- prometheus.MustNewConstMetric(c.perSeq, prometheus.GaugeValue, f.Fit.PerSeq, f.Node)
		ch <- prometheus.MustNewConstMetric(c.samples, prometheus.GaugeValue, f.Fit.Samples, f.Node)
	}
	ch <- prometheus.MustNewConstMetric(c.fleetScale, prometheus.GaugeValue, fleet.FleetScale)
	ch <- prometheus.MustNewConstMetric(c.fleetOver, prometheus.GaugeValue, fleet.Overhead)
	ch <- prometheus.MustNewConstMetric(c.fleetSeqDs, prometheus.GaugeValue, fleet.PerSeq)
}
