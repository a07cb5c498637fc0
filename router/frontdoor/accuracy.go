package frontdoor

import "github.com/prometheus/client_golang/prometheus"

// EstimateAccuracy measures the closed loop of a door: how often the router's estimate of a
// request's reused tokens equalled what the engine reported reusing (cached_tokens), and by how
// much it missed. The front door and the gateway's endpoint picker each keep one, under their
// own subsystem, so the two doors are compared on the same series.
type EstimateAccuracy struct {
	exact    prometheus.Counter   // requests whose estimate equalled cached_tokens
	compared prometheus.Counter   // requests with both an estimate and cached_tokens
	absError prometheus.Histogram // |estimate − cached_tokens| in tokens
}

// NewEstimateAccuracy returns the series prefixmesh_<subsystem>_estimate_*; Collectors lists
// them for registration.
func NewEstimateAccuracy(subsystem string) *EstimateAccuracy {
	const ns = "prefixmesh"
	return &EstimateAccuracy{
		exact: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: subsystem, Name: "estimate_exact_total",
			Help: "Requests whose estimated matched tokens equalled the engine's cached_tokens."}),
		compared: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: subsystem, Name: "estimate_compared_total",
			Help: "Requests whose engine reported cached_tokens (the denominator of estimate accuracy)."}),
		absError: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: subsystem, Name: "estimate_abs_error_tokens",
			Help:    "Absolute difference between the estimated matched tokens and the engine's cached_tokens.",
			Buckets: append([]float64{0}, prometheus.ExponentialBuckets(16, 2, 12)...)}),
	}
}

// Collectors are the series to register.
func (a *EstimateAccuracy) Collectors() []prometheus.Collector {
	return []prometheus.Collector{a.exact, a.compared, a.absError}
}

// Observe compares an estimate with the engine's cached_tokens; a negative value of either means
// it is unknown, and the request is not compared.
func (a *EstimateAccuracy) Observe(estimate, cached int) {
	if estimate < 0 || cached < 0 {
		return
	}
	a.compared.Inc()
	diff := estimate - cached
	if diff == 0 {
		a.exact.Inc()
	}
	a.absError.Observe(float64(max(diff, -diff)))
}
