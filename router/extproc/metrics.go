package extproc

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixmesh/prefixmesh/router/requests"
)

// metrics are the endpoint picker's Prometheus series.
type metrics struct {
	decisions    *prometheus.CounterVec     // result: prefix, load, no_nodes, overloaded, subset_empty
	outcomes     *prometheus.CounterVec     // class: 2xx, 4xx, 5xx, none, served_elsewhere
	streamErrors *prometheus.CounterVec     // cause
	accuracy     *requests.EstimateAccuracy // estimate against cached_tokens, as the front door's
	decideSecs   prometheus.Histogram
	answerSecs   prometheus.Histogram
	ttft         prometheus.Histogram
	streams      prometheus.Gauge
	buffered     prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "prefixmesh", "extproc"
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "decisions_total",
			Help: "Endpoint picks by result: prefix (routed on the prompt's tokens), load (no prompt to read), no_nodes, overloaded, subset_empty, shed (flow control's 429)."}, []string{"result"}),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "outcomes_total",
			Help: "Routed requests by how they ended: the response's status class (2xx, 4xx, 5xx), none (no response), served_elsewhere (the gateway used a fallback)."}, []string{"class"}),
		streamErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "stream_errors_total",
			Help: "Streams ended abnormally, by cause: too_large, busy, too_many_streams, request_timeout, stream_timeout, protocol, cancelled, send."}, []string{"cause"}),
		accuracy: requests.NewEstimateAccuracy(sub),
		decideSecs: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "decision_seconds",
			Help: "Time from the end of the request body to the answer: parse, tokenise, pick.", Buckets: prometheus.ExponentialBuckets(5e-6, 2, 16)}),
		answerSecs: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "answer_seconds",
			Help: "Time from the end of the request body to the last answer handed to gRPC: the decision plus encoding the answer and the body back.", Buckets: prometheus.ExponentialBuckets(5e-6, 2, 16)}),
		ttft: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "ttft_seconds",
			Help: "Time from the pick to the first output token (streams) or the response headers.", Buckets: requests.LatencyBuckets}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "streams",
			Help: "ext_proc streams open now."}),
		buffered: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "buffered_body_bytes",
			Help: "Request body bytes held across streams now."}),
	}
	// Known label values exist at 0 from the start: a rate over them reads 0, not "no data".
	for _, r := range []string{"prefix", "load", "no_nodes", "overloaded", "subset_empty", "shed"} {
		m.decisions.WithLabelValues(r)
	}
	for _, c := range []string{"2xx", "4xx", "5xx", "none", "served_elsewhere"} {
		m.outcomes.WithLabelValues(c)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range append([]prometheus.Collector{m.decisions, m.outcomes, m.streamErrors, m.decideSecs, m.answerSecs,
		m.ttft, m.streams, m.buffered}, m.accuracy.Collectors()...) {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
