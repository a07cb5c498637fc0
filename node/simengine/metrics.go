package simengine

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the engine's Prometheus series, all named prefixmesh_simengine_*.
type metrics struct {
	requests      *prometheus.CounterVec // by endpoint and HTTP status code
	promptTokens  prometheus.Counter
	cachedTokens  prometheus.Counter
	prefillTokens prometheus.Counter
	outputTokens  prometheus.Counter
	ttft          prometheus.Histogram
	// The CPU tier's share of cachedTokens, the simulated time charged for loading it, and the
	// prompt tokens' share of the steps' time (Step.PerPrefillToken a token computed).
	cpuLoadedTokens prometheus.Counter
	loadSeconds     prometheus.Counter
	prefillSeconds  prometheus.Counter
	// Disaggregation (kvtransfer.go): requests by leg; pulls by kind (decode, peer) and outcome
	// (ok, recompute, fail); tokens pulled and the simulated time charged for them; blocks this
	// engine served to pullers; leases that expired unread.
	legs            *prometheus.CounterVec
	pulls           *prometheus.CounterVec
	pulledTokens    *prometheus.CounterVec
	transferSeconds prometheus.Counter
	servedBlocks    *prometheus.CounterVec
	leasesExpired   prometheus.Counter
}

func newMetrics(e *Engine, reg *prometheus.Registry) (*metrics, error) {
	const ns, sub = "prefixmesh", "simengine"
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "requests_total", Help: "HTTP requests by endpoint and status code."}, []string{"endpoint", "code"}),
		promptTokens: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "prompt_tokens_total", Help: "Prompt tokens of admitted requests."}),
		cachedTokens: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "cached_tokens_total", Help: "Prompt tokens whose KV blocks were reused from the prefix cache."}),
		prefillTokens: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "prefill_tokens_total", Help: "Uncached prompt tokens to prefill, of admitted requests."}),
		outputTokens: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "output_tokens_total", Help: "Tokens generated."}),
		cpuLoadedTokens: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "cpu_loaded_tokens_total", Help: "Cached prompt tokens loaded from the CPU tier rather than found on the GPU (part of cached_tokens_total)."}),
		loadSeconds: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "cpu_load_seconds_total", Help: "Simulated time charged for loading KV from the CPU tier."}),
		prefillSeconds: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "prefill_seconds_total", Help: "Simulated time of the engine steps charged to the prompt tokens they computed (the per-token term of the step model)."}),
		legs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "legs_total", Help: "Admitted generation requests by the leg they served: whole, prefill (do_remote_decode) or decode (do_remote_prefill)."}, []string{"leg"}),
		pulls: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "kv_pulls_total", Help: "KV pulls from other engines by kind (decode: a prefill leg's lease; peer: remote_kv_source) and outcome (ok, recompute, fail)."}, []string{"kind", "outcome"}),
		pulledTokens: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "kv_pulled_tokens_total", Help: "Prompt tokens whose KV was pulled from another engine, by kind."}, []string{"kind"}),
		transferSeconds: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "kv_transfer_seconds_total", Help: "Simulated time charged for pulling KV from other engines."}),
		servedBlocks: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "kv_served_blocks_total", Help: "KV blocks this engine served to pulling engines, by kind."}, []string{"kind"}),
		leasesExpired: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "kv_leases_expired_total", Help: "Prefill legs' leases that expired before a decode engine pulled them."}),
		// 1 ms to ~33 s: a fully cached prompt's TTFT is sub-millisecond plus queueing; a cold
		// 128k-token prompt at 10k tok/s takes ~13 s.
		ttft: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub,
			Name: "ttft_seconds", Help: "Time from request arrival to the first output token.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)}),
	}
	if reg == nil {
		return m, nil
	}
	gauge := func(name, help string, f func(Load) int) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help},
			func() float64 { return float64(f(e.Load())) })
	}
	for _, c := range []prometheus.Collector{
		m.requests, m.promptTokens, m.cachedTokens, m.prefillTokens, m.outputTokens, m.ttft,
		m.cpuLoadedTokens, m.loadSeconds, m.prefillSeconds,
		m.legs, m.pulls, m.pulledTokens, m.transferSeconds, m.servedBlocks, m.leasesExpired,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "kv_leases",
			Help: "Prefill legs whose blocks are pinned until a decode engine pulls them or the lease expires."},
			func() float64 { return float64(e.Leases()) }),
		gauge("queue_depth", "Requests waiting for a slot or for KV blocks.", func(l Load) int { return l.Waiting }),
		gauge("running", "Sequences admitted and not finished.", func(l Load) int { return l.Running }),
		gauge("free_blocks", "KV blocks with no reference.", func(l Load) int { return l.FreeBlocks }),
		gauge("queued_prefill_tokens", "Uncached prompt tokens not yet prefilled.", func(l Load) int { return l.QueuedPrefillTokens }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "evicted_blocks_total",
			Help: "Cached KV blocks evicted to make room."}, func() float64 { return float64(e.PoolStats().Evicted) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "cpu_blocks",
			Help: "GPU-sized KV blocks the CPU tier holds."}, func() float64 { return float64(e.TierStats().CPUBlocks) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "cpu_stored_chunks_total",
			Help: "Chunks the GPU evicted that spilled into the CPU tier."}, func() float64 { return float64(e.TierStats().Stored) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "cpu_evicted_chunks_total",
			Help: "Chunks the CPU tier evicted (LRU) to make room."}, func() float64 { return float64(e.TierStats().Evicted) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "kv_events_dropped_total",
			Help: "KV event batches not sent live because the publisher's queue was full (kept for replay)."},
			func() float64 { return float64(e.kvEventsDropped()) }),
	} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
