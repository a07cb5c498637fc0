package frontdoor

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/prefixmesh/prefixmesh/internal/bytebudget"
	"github.com/prefixmesh/prefixmesh/router/requests"
)

// metrics are the front door's Prometheus series.
type metrics struct {
	requests  *prometheus.CounterVec     // endpoint, code, outcome
	decisions *prometheus.CounterVec     // node, policy, reason
	accuracy  *requests.EstimateAccuracy // estimate against cached_tokens
	ttft      prometheus.Histogram       // seconds to the first token (streams) or the response
	latency   *prometheus.HistogramVec   // endpoint
	retries   *prometheus.CounterVec     // cause
	ejections *prometheus.CounterVec     // node
	// firstByteTimeouts counts attempts whose engine sent no response headers in time, by node.
	firstByteTimeouts *prometheus.CounterVec
	// brokenStreams counts responses cut after they began, by node and cause.
	brokenStreams *prometheus.CounterVec
	rejected      *prometheus.CounterVec // reason: overloaded, draining, too_large, body_timeout, body_budget
	inflight      prometheus.Gauge
	// prefillLegs counts disaggregated requests' prefill legs by outcome (pd.go).
	prefillLegs *prometheus.CounterVec
	// peerPulls counts requests sent with a peer to pull their prefix from.
	peerPulls prometheus.Counter
}

// reasonBodyBudget is rejected_total's reason for a body refused because the bytes held across
// requests are at the service's body budget (requests.Config.MaxBodyBufferBytes).
const reasonBodyBudget = "body_budget"

func newMetrics(reg prometheus.Registerer, bodies *bytebudget.Budget) (*metrics, error) {
	const ns, sub = "prefixmesh", "frontdoor"
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "requests_total",
			Help: "HTTP requests by endpoint, status code and outcome (complete, or the cause a response was cut after it began)."}, []string{"endpoint", "code", "outcome"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "decisions_total",
			Help: "Routing decisions by chosen node, policy and reason (retries included)."}, []string{"node", "policy", "reason"}),
		accuracy: requests.NewEstimateAccuracy(sub),
		ttft: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "ttft_seconds",
			Help: "Time from arrival to the first output token relayed (streams) or to the response headers.", Buckets: requests.LatencyBuckets}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "request_duration_seconds",
			Help: "Time from arrival to the end of the response.", Buckets: requests.LatencyBuckets}, []string{"endpoint"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "retries_total",
			Help: "Requests retried on another node before anything reached the client, by the first attempt's failure: connect, first_byte_timeout, status_429, status_5xx."},
			[]string{"cause"}),
		firstByteTimeouts: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "first_byte_timeouts_total",
			Help: "Streaming attempts whose engine sent no byte within the first-byte deadline, by node."}, []string{"node"}),
		brokenStreams: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "broken_streams_total",
			Help: "Responses cut after they began, by node and cause: upstream_error, idle_timeout, drain, upstream_timeout, client_closed."},
			[]string{"node", "cause"}),
		ejections: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "ejections_total",
			Help: "Nodes ejected by passive health."}, []string{"node"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "rejected_total",
			Help: "Requests refused before routing, by reason: overloaded, draining, too_large, body_timeout, body_budget."}, []string{"reason"}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "inflight_requests",
			Help: "Requests being proxied now."}),
		prefillLegs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "prefill_legs_total",
			Help: "Prefill legs of disaggregated requests by outcome: ok; no_kv_transfer_params and failed (the decode node prefilled locally); refused (the prefill engine's error went to the client); aborted (the request ended first)."},
			[]string{"outcome"}),
		peerPulls: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "peer_pulls_total",
			Help: "Requests sent to their node with a peer to pull the prompt's cached prefix from (kv_transfer_params.remote_kv_source)."}),
	}
	// The label values known in advance exist at 0 from the start, so a rate over them reads 0,
	// not "no data" (which a renamed series would also give).
	for _, r := range []string{"overloaded", "draining", "too_large", "body_timeout", reasonBodyBudget} {
		m.rejected.WithLabelValues(r)
	}
	for _, c := range []string{causeConnect, causeFirstByte, causeStatus429, causeStatus5xx} {
		m.retries.WithLabelValues(c)
	}
	for _, o := range []string{prefillOK, prefillNoParams, prefillFailed, prefillRefused, prefillAborted} {
		m.prefillLegs.WithLabelValues(o)
	}
	if reg == nil {
		return m, nil
	}
	// Read at scrape time: the budget's own counter, nothing per request.
	buffered := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "buffered_body_bytes",
		Help: "Request body bytes held now (buffers as charged to the body budget, --max-body-buffer-bytes)."},
		func() float64 { return float64(bodies.Held()) })
	for _, c := range append([]prometheus.Collector{m.requests, m.decisions, m.ttft, m.latency, m.retries, m.ejections,
		m.rejected, m.inflight, m.firstByteTimeouts, m.brokenStreams, m.prefillLegs, m.peerPulls, buffered}, m.accuracy.Collectors()...) {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// ObserveEjection counts an ejection; pass it to requests.Health.OnEject.
func (s *Server) ObserveEjection(nodeID string) { s.met.ejections.WithLabelValues(nodeID).Inc() }

// brokenCauses are the causes of broken_streams_total.
var brokenCauses = []string{causeUpstream, causeIdle, causeDrain, causeUpstreamTime, causeClient}

// ForgetDeparted deletes the per-node series of every node not in present, so the series stay
// bounded by the fleet however many node ids churn through, and creates at 0 the per-node
// counters of the nodes present (a node with no ejection yet reads 0, not "no data"); pass it
// to requests.Health.OnSweep.
func (s *Server) ForgetDeparted(present map[string]bool) {
	for id := range present {
		s.met.ejections.WithLabelValues(id)
		s.met.firstByteTimeouts.WithLabelValues(id)
		for _, c := range brokenCauses {
			s.met.brokenStreams.WithLabelValues(id, c)
		}
	}
	for _, vec := range []*prometheus.CounterVec{s.met.decisions, s.met.firstByteTimeouts, s.met.brokenStreams, s.met.ejections} {
		for _, id := range nodeLabels(vec) {
			if !present[id] {
				vec.DeletePartialMatch(prometheus.Labels{"node": id})
			}
		}
	}
}

// nodeLabels lists the distinct "node" label values of vec's series.
func nodeLabels(vec *prometheus.CounterVec) []string {
	ch := make(chan prometheus.Metric)
	go func() { vec.Collect(ch); close(ch) }()
	seen := map[string]bool{}
	var ids []string
	for m := range ch {
		var pm dto.Metric
		if m.Write(&pm) != nil {
			continue
		}
		for _, l := range pm.GetLabel() {
			if l.GetName() == "node" && !seen[l.GetValue()] {
				seen[l.GetValue()] = true
				ids = append(ids, l.GetValue())
			}
		}
	}
	return ids
}
