package kvevents

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the follower's Prometheus series, labelled by data-parallel rank.
type metrics struct {
	batches    *prometheus.CounterVec // applied batches
	events     *prometheus.CounterVec // applied events by kind
	skipped    *prometheus.CounterVec // events skipped: unknown tag, malformed
	fields     *prometheus.CounterVec // unknown fields skipped
	decodeErrs *prometheus.CounterVec // messages dropped whole
	gaps       *prometheus.CounterVec
	replays    *prometheus.CounterVec // by result: ok, short, failed
	resyncs    *prometheus.CounterVec // by cause: gap, restart, start
	lag        *prometheus.HistogramVec
	complete   *prometheus.GaugeVec
	cold       *prometheus.GaugeVec
	partial    *prometheus.CounterVec // partial transitions by reason
	lossy      *prometheus.CounterVec // batches not applied whole
	peerEnds   *prometheus.CounterVec // --kv-events-listen: peer connections that ended
}

func newMetrics(reg prometheus.Registerer, mir *CacheMirror) (*metrics, error) {
	const ns, sub = "prefixmesh", "kvevents"
	rank := []string{"rank"}
	m := &metrics{
		batches: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "batches_total",
			Help: "KV event batches applied to the mirror."}, rank),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "events_total",
			Help: "KV events applied to the mirror, by kind."}, []string{"rank", "kind"}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "events_skipped_total",
			Help: "KV events skipped inside an applied batch: unknown tag or malformed field."}, []string{"rank", "reason"}),
		fields: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "unknown_fields_total",
			Help: "Unknown map keys and trailing positional fields skipped."}, rank),
		decodeErrs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "decode_errors_total",
			Help: "Messages dropped whole: wrong frame count, bad sequence frame, undecodable payload."}, rank),
		gaps: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "gaps_total",
			Help: "Sequence gaps seen (messages lost between the engine and the agent)."}, rank),
		replays: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "replays_total",
			Help: "Replay requests, by result: ok, short (the buffer no longer reaches back), failed."}, []string{"rank", "result"}),
		resyncs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "resyncs_total",
			Help: "Mirror resets, by cause: restart (sequence went back), gap (not replayable), decode (a batch not applied whole), start (joined late)."}, []string{"rank", "cause"}),
		lag: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "lag_seconds",
			Help:    "Time from the engine's batch timestamp to its application in the mirror.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}, rank),
		complete: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "mirror_complete",
			Help: "1 when the rank's mirror saw every batch since the engine's first (or a clear): exact; 0 while it is partial, a lower bound."}, rank),
		cold: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "mirror_cold",
			Help: "1 while the rank's mirror may hold blocks the engine no longer has (a reloaded checkpoint awaiting replay): routers take no affinity from the node."}, rank),
		partial: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "partial_total",
			Help: "Times a rank's mirror became partial (a lower bound), by reason: late_join, gap, decode, checkpoint."}, []string{"rank", "reason"}),
		lossy: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "lossy_batches_total",
			Help: "Sequenced batches not applied whole (undecodable, or a malformed or unknown event): each is a gap."}, rank),
		peerEnds: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "peer_disconnects_total",
			Help: "With --kv-events-listen: peer connections that ended (the engine reconnecting, or a stranger); the subscription stays up."}, rank),
	}
	cs := []prometheus.Collector{m.batches, m.events, m.skipped, m.fields, m.decodeErrs, m.gaps, m.replays, m.resyncs, m.lag, m.complete,
		m.cold, m.partial, m.lossy, m.peerEnds, mirrorCollector{mir}}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register kvevents metrics: %w", err)
		}
	}
	return m, nil
}

// Label values of the per-rank counters, listed so that each rank's series exist at 0 from the
// start: a dashboard or alert over rate(...{reason="gap"}) then reads 0, not "no data", which a
// renamed series would also give.
var (
	partialReasons = []string{"late_join", "gap", "decode", "checkpoint"}
	replayResults  = []string{"ok", "short", "failed", "none", "restarted"}
	resyncCauses   = []string{"restart", "gap", "decode", "start"}
)

// initRank creates rank r's counters at 0.
func (m *metrics) initRank(r string) {
	for _, c := range []*prometheus.CounterVec{m.batches, m.fields, m.decodeErrs, m.gaps, m.lossy} {
		c.WithLabelValues(r)
	}
	for _, v := range partialReasons {
		m.partial.WithLabelValues(r, v)
	}
	for _, v := range replayResults {
		m.replays.WithLabelValues(r, v)
	}
	for _, v := range resyncCauses {
		m.resyncs.WithLabelValues(r, v)
	}
	m.complete.WithLabelValues(r).Set(0)
	m.cold.WithLabelValues(r).Set(0)
}

// mirrorCollector exports the mirror's levels at scrape time.
type mirrorCollector struct{ m *CacheMirror }

var (
	descBlocks  = prometheus.NewDesc("prefixmesh_kvevents_mirrored_blocks", "Blocks mirrored from the engine (any tier).", nil, nil)
	descTier    = prometheus.NewDesc("prefixmesh_kvevents_block_copies", "Block copies held by the engine, by tier.", []string{"tier"}, nil)
	descVisible = prometheus.NewDesc("prefixmesh_kvevents_visible_hashes", "Canonical block hashes matchable from the root (the summary).", nil, nil)
	descOrphans = prometheus.NewDesc("prefixmesh_kvevents_orphan_blocks", "Stored blocks whose chain does not reach the root yet.", nil, nil)
	descUnknown = prometheus.NewDesc("prefixmesh_kvevents_unknown_hash_events_total", "Removals or tier updates naming a hash the mirror does not hold.", nil, nil)
	descUnalign = prometheus.NewDesc("prefixmesh_kvevents_unaligned_events_total", "Stored events whose tokens do not line up with their hashes (kept, never matched).", nil, nil)
	descWrongBS = prometheus.NewDesc("prefixmesh_kvevents_wrong_block_size_events_total", "Stored events with another block size than --block-size (kept, never matched).", nil, nil)
	descUnder   = prometheus.NewDesc("prefixmesh_kvevents_underrun_events_total", "Removals of a tier the block held no copy on (the mirror missed its store: a late join or a lost batch).", nil, nil)
	descCleared = prometheus.NewDesc("prefixmesh_kvevents_cleared_total", "AllBlocksCleared events and mirror resets applied.", nil, nil)
	descCycles  = prometheus.NewDesc("prefixmesh_kvevents_cycle_events_total", "Stored blocks that named a descendant as parent (dropped as corrupt).", nil, nil)
	descPlace   = prometheus.NewDesc("prefixmesh_kvevents_placeholders_total", "Offload placeholders (a hash without tokens) applied as a lower-tier copy of a known block.", nil, nil)
	descAged    = prometheus.NewDesc("prefixmesh_kvevents_aged_out_copies_total", "Copies on a tier that never sent a removal, dropped after the unremoved-tier TTL, by tier.", []string{"tier"}, nil)
)

func (c mirrorCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descBlocks, descTier, descVisible, descOrphans, descUnknown, descUnalign, descWrongBS, descUnder, descCleared, descCycles, descPlace, descAged} {
		ch <- d
	}
}

// Collect exports every tier's series, at 0 when empty, so that each exists from the start.
func (c mirrorCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.Expire() // a scrape never reports copies already past their TTL
	s := c.m.MirrorStats()
	ch <- prometheus.MustNewConstMetric(descBlocks, prometheus.GaugeValue, float64(s.Blocks))
	for t := Tier(0); t < numTiers; t++ {
		ch <- prometheus.MustNewConstMetric(descTier, prometheus.GaugeValue, float64(s.Tiers[t]), t.String())
	}
	ch <- prometheus.MustNewConstMetric(descVisible, prometheus.GaugeValue, float64(s.Visible))
	ch <- prometheus.MustNewConstMetric(descOrphans, prometheus.GaugeValue, float64(s.Orphans))
	ch <- prometheus.MustNewConstMetric(descUnknown, prometheus.CounterValue, float64(s.Unknown))
	ch <- prometheus.MustNewConstMetric(descUnalign, prometheus.CounterValue, float64(s.Unaligned))
	ch <- prometheus.MustNewConstMetric(descWrongBS, prometheus.CounterValue, float64(s.WrongBlockSize))
	ch <- prometheus.MustNewConstMetric(descUnder, prometheus.CounterValue, float64(s.Underrun))
	ch <- prometheus.MustNewConstMetric(descCleared, prometheus.CounterValue, float64(s.Cleared))
	ch <- prometheus.MustNewConstMetric(descCycles, prometheus.CounterValue, float64(s.Cycles))
	ch <- prometheus.MustNewConstMetric(descPlace, prometheus.CounterValue, float64(s.Placeholders))
	for t := Tier(0); t < numTiers; t++ {
		ch <- prometheus.MustNewConstMetric(descAged, prometheus.CounterValue, float64(s.AgedOut[t]), t.String())
	}
}
