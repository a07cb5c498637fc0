package router

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/status"

	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
)

type metrics struct {
	routes  *prometheus.CounterVec // by reason, or by gRPC code on error
	matched prometheus.Histogram   // estimated matched tokens of the chosen node
	latency prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m := &metrics{
		routes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "prefixmesh_router_routes_total", Help: "Route calls, by the policy's reason or the error code.",
		}, []string{"result"}),
		matched: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "prefixmesh_router_estimated_matched_tokens", Help: "Estimated cached prompt tokens on the chosen node.",
			Buckets: prometheus.ExponentialBuckets(16, 2, 14), // 16 … 128k tokens
		}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "prefixmesh_router_route_seconds", Help: "Time to answer Route.",
			Buckets: prometheus.ExponentialBuckets(1e-6, 4, 12), // 1 µs … 4 s
		}),
	}
	for _, c := range []prometheus.Collector{m.routes, m.matched, m.latency} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *metrics) observe(resp *pb.RouteResponse, err error, d time.Duration) {
	m.latency.Observe(d.Seconds())
	if err != nil {
		m.routes.WithLabelValues(status.Code(err).String()).Inc()
		return
	}
	m.routes.WithLabelValues(resp.GetReason()).Inc()
	m.matched.Observe(float64(resp.GetEstimatedMatchedTokens()))
}
