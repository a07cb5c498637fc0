package peershare

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixmesh/prefixmesh/routing"
)

type metrics struct {
	queued, sent, received *prometheus.CounterVec // by kind: decision, load, ttft
	sentBytes              *prometheus.CounterVec // by kind
	drops                  *prometheus.CounterVec // by reason
	forgotten              prometheus.Counter
	ttftSkipped            prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, dec *routing.Decider) (*metrics, error) {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m := &metrics{
		queued: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixmesh_share_queued_packets_total", Help: "Share packets queued to send to the other routers, by kind.",
		}, []string{"kind"}),
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixmesh_share_sent_packets_total", Help: "Share packets sent to the other routers (each to every one), by kind.",
		}, []string{"kind"}),
		sentBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixmesh_share_sent_bytes_total", Help: "Bytes of share packets sent, counted once per packet (multiply by the other routers for the wire), by kind.",
		}, []string{"kind"}),
		received: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixmesh_share_received_packets_total", Help: "Share packets from other routers applied, by kind.",
		}, []string{"kind"}),
		drops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixmesh_share_dropped_packets_total", Help: "Share packets dropped, by reason.",
		}, []string{"reason"}),
		forgotten: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "prefixmesh_share_peers_forgotten_total", Help: "Peer routers whose load was dropped because they left the membership.",
		}),
		ttftSkipped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "prefixmesh_share_ttft_skipped_total", Help: "First-token observations from other routers not learned from: their node is not a member, or the figures are implausible.",
		}),
	}
	// Every drop reason exists at 0 from the start: a rate over one reads 0, not "no data".
	for _, r := range []string{"send_queue_full", "receive_queue_full", "decode", "encode", "peer_table_full", "unknown_node"} {
		m.drops.WithLabelValues(r)
	}
	peers := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "prefixmesh_share_peers", Help: "Other routers whose in-flight load report counts.",
	}, func() float64 { return float64(dec.Peers()) })
	for _, c := range []prometheus.Collector{m.queued, m.sent, m.sentBytes, m.received, m.drops, m.forgotten, m.ttftSkipped, peers} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
