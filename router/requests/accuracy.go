package requests

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// EstimateAccuracy measures the closed loop of a door: how often the router's estimate of a
// request's reused tokens equalled what the engine reported reusing (cached_tokens), and by how
// much it missed; the engine-observed reuse itself (cached against prompt tokens); and the TTFT
// the router predicted for the requests whose TTFT the door observes, to set beside the door's
// ttft_seconds. The front door and the gateway's endpoint picker each keep one, under their own
// subsystem, so the two doors are compared on the same series.
type EstimateAccuracy struct {
	exact    prometheus.Counter   // requests whose estimate equalled cached_tokens
	compared prometheus.Counter   // requests with both an estimate and cached_tokens
	absError prometheus.Histogram // |estimate − cached_tokens| in tokens
	// prompt and cached sum, over the compared requests, the prompt's tokens (as the router
	// counted them) and the engine's cached_tokens: the hit ratio the engines observed.
	prompt, cached prometheus.Counter
	predicted      prometheus.Histogram // the router's expected TTFT, seconds
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
		prompt: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: subsystem, Name: "engine_prompt_tokens_total",
			Help: "Prompt tokens (as the router counted them) of the requests whose engine reported cached_tokens."}),
		cached: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: subsystem, Name: "engine_cached_tokens_total",
			Help: "cached_tokens the engines reported: over engine_prompt_tokens_total, the hit ratio the engines observed."}),
		predicted: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: subsystem, Name: "predicted_ttft_seconds",
			Help:    "The TTFT the router predicted for the chosen node, for the requests whose TTFT ttft_seconds observed.",
			Buckets: LatencyBuckets}),
	}
}

// Collectors are the series to register.
func (a *EstimateAccuracy) Collectors() []prometheus.Collector {
	return []prometheus.Collector{a.exact, a.compared, a.absError, a.prompt, a.cached, a.predicted}
}

// ObservePredictedTTFT records the router's predicted TTFT of a request whose observed TTFT the
// door records (0: no prediction, not recorded).
func (a *EstimateAccuracy) ObservePredictedTTFT(d time.Duration) {
	if d > 0 {
		a.predicted.Observe(d.Seconds())
	}
}

// Observe compares an estimate with the engine's cached_tokens for a prompt of prompt tokens; a
// negative estimate or cached_tokens means it is unknown, and the request is not compared.
func (a *EstimateAccuracy) Observe(estimate, cached, prompt int) {
	if estimate < 0 || cached < 0 {
		return
	}
	a.compared.Inc()
	if prompt > 0 {
		a.prompt.Add(float64(prompt))
		a.cached.Add(float64(cached))
	}
	diff := estimate - cached
	if diff == 0 {
		a.exact.Inc()
	}
	a.absError.Observe(float64(max(diff, -diff)))
}
