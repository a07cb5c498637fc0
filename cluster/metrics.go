package cluster

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixmesh/prefixmesh/routing"
)

// metrics are an agent's Prometheus series, registered on Config.Registry.
type metrics struct {
	bytesSent      *prometheus.CounterVec // by message type
	bytesReceived  *prometheus.CounterVec // by message type
	packetsSent    *prometheus.CounterVec
	drops          *prometheus.CounterVec // by reason
	repairs        *prometheus.CounterVec // by reason
	repairFailures prometheus.Counter
	held           prometheus.Counter   // deltas that arrived ahead of a missing one
	lag            prometheus.Histogram // node emit → router apply, seconds
	nodes          prometheus.Gauge     // node members the mirror tracks
	coldNodes      prometheus.Gauge     // of those, flagged cold (Meta.Cold)
	sendErrors     prometheus.Counter
	members        *prometheus.GaugeVec // live members by role, this one included
	joinFailures   prometheus.Counter
	isolated       prometheus.Gauge       // 1 while a member with seeds knows no other member
	logLines       *prometheus.CounterVec // memberlist warnings and errors, by level
	badPackets     *prometheus.CounterVec // outsider-triggerable packet faults, by kind
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m := &metrics{
		bytesSent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixmesh_gossip_sent_bytes_total", Help: "Bytes of prefixmesh gossip messages sent (before memberlist framing), by type.",
		}, []string{"type"}),
		bytesReceived: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixmesh_gossip_received_bytes_total", Help: "Bytes of prefixmesh gossip messages received, by type.",
		}, []string{"type"}),
		packetsSent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixmesh_gossip_sent_packets_total", Help: "prefixmesh gossip messages sent, by type.",
		}, []string{"type"}),
		drops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixmesh_gossip_dropped_total", Help: "Received gossip messages dropped, by reason.",
		}, []string{"reason"}),
		repairs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixmesh_gossip_repairs_total", Help: "Full-summary pulls started, by reason (join, epoch, gap, behind, checksum, silence, ...).",
		}, []string{"reason"}),
		repairFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "prefixmesh_gossip_repair_failures_total", Help: "Full-summary pulls that failed and will be retried.",
		}),
		held: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "prefixmesh_gossip_held_deltas_total", Help: "Deltas that arrived ahead of a missing one and were held (reordering or loss).",
		}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "prefixmesh_gossip_delta_lag_seconds",
			Help:    "Time from a node building a summary delta to the router receiving it (clocks of two hosts).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14), // 0.5 ms … 4 s
		}),
		nodes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "prefixmesh_gossip_mirrored_nodes", Help: "Node members the router mirrors.",
		}),
		coldNodes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "prefixmesh_gossip_cold_nodes", Help: "Mirrored nodes flagged cold (their cache view may hold blocks the engine lost: routed by load, no prefix affinity).",
		}),
		sendErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "prefixmesh_gossip_send_errors_total", Help: "Best-effort sends that failed locally.",
		}),
	}
	m.members = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "prefixmesh_gossip_members", Help: "Live gossip members this member knows, by role (node, router), itself included.",
	}, []string{"role"})
	m.joinFailures = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "prefixmesh_gossip_join_failures_total", Help: "Attempts to join the seeds that reached no member (wrong key or label, seeds down).",
	})
	m.isolated = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "prefixmesh_gossip_isolated", Help: "1 while this member was given seeds but knows no other member (health reports NOT_SERVING), else 0.",
	})
	m.logLines = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "prefixmesh_gossip_log_lines_total", Help: "memberlist warnings and errors, by level, whether logged or suppressed by the rate limit.",
	}, []string{"level"})
	m.badPackets = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "prefixmesh_gossip_bad_packets_total", Help: "Gossip packets and streams memberlist refused, by kind (decrypt, label, checksum, decode, stream).",
	}, []string{"kind"})
	// The reasons known in advance exist at 0 from the start, so a rate over one reads 0, not
	// "no data" (which a renamed series would also give).
	for _, r := range []string{"inbox_full", "decode", "unknown_node", "other_epoch", "duplicate", "held_overflow", "malformed", "bad_meta", "share_unhandled"} {
		m.drops.WithLabelValues(r)
	}
	for _, r := range []string{"join", "epoch", "gap", "behind", "checksum", "silence", "held_overflow", "malformed"} {
		m.repairs.WithLabelValues(r)
	}
	for _, c := range []prometheus.Collector{m.bytesSent, m.bytesReceived, m.packetsSent, m.drops, m.repairs, m.repairFailures, m.held, m.lag, m.nodes, m.coldNodes, m.sendErrors, m.members, m.joinFailures, m.isolated, m.logLines, m.badPackets} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// indexStats is implemented by routing.Index.
type indexStats interface{ Stats() routing.IndexStats }

// registerIndexGauges exports the size of the index the mirror feeds, read at scrape time.
func registerIndexGauges(reg prometheus.Registerer, idx Index) error {
	st, ok := idx.(indexStats)
	if !ok {
		return nil
	}
	if reg == nil {
		return nil
	}
	for _, g := range []struct {
		name, help string
		f          func(routing.IndexStats) float64
	}{
		{"prefixmesh_index_nodes", "Nodes the summary index holds a snapshot of.", func(s routing.IndexStats) float64 { return float64(s.Nodes) }},
		{"prefixmesh_index_pairs", "(block hash, node) pairs in the summary index.", func(s routing.IndexStats) float64 { return float64(s.Pairs) }},
		{"prefixmesh_index_distinct_hashes", "Distinct block hashes in the summary index.", func(s routing.IndexStats) float64 { return float64(s.DistinctHashes) }},
		{"prefixmesh_index_bytes", "Estimated heap held by the summary index.", func(s routing.IndexStats) float64 { return float64(s.ApproxBytes) }},
		{"prefixmesh_index_refused_adds", "Adds refused because the index was at its pair or byte bound (since start).", func(s routing.IndexStats) float64 { return float64(s.RefusedAdds) }},
	} {
		f := g.f
		if err := reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: g.name, Help: g.help},
			func() float64 { return f(st.Stats()) })); err != nil {
			return err
		}
	}
	return nil
}

func msgTypeName(t byte) string {
	switch t {
	case msgDelta:
		return "delta"
	case msgState:
		return "state"
	case msgPush:
		return "pushpull"
	case msgShare:
		return "share"
	default:
		return "other"
	}
}

func (m *metrics) drop(reason string) { m.drops.WithLabelValues(reason).Inc() }

func (m *metrics) received(t byte, n int) {
	m.bytesReceived.WithLabelValues(msgTypeName(t)).Add(float64(n))
}

func (m *metrics) sent(t byte, n int) {
	m.bytesSent.WithLabelValues(msgTypeName(t)).Add(float64(n))
	m.packetsSent.WithLabelValues(msgTypeName(t)).Inc()
}
