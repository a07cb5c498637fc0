package pins

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the store's Prometheus collectors, registered on the caller's registry.
type metrics struct {
	writes        *prometheus.HistogramVec // by outcome
	leaderChanges prometheus.Counter
	applied       prometheus.GaugeFunc
	staleness     prometheus.GaugeFunc
}

func newMetrics(s *Store) *metrics {
	return &metrics{
		writes: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "prefixmesh_pins_write_seconds",
			Help: "Pin write latency, from Store.Write to the applied result (forwarding included).",
			// 0.5 ms … 8 s: loopback commits take about a millisecond, failovers seconds.
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 15),
		}, []string{"outcome"}),
		leaderChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "prefixmesh_pins_leader_changes_total",
			Help: "Raft leader changes this member observed.",
		}),
		applied: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "prefixmesh_pins_applied_index",
			Help: "Raft index of the last entry applied to this member's pin table.",
		}, func() float64 { return float64(s.fsm.AppliedIndex()) }),
		staleness: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "prefixmesh_pins_read_staleness_seconds",
			Help: "Upper bound on the age of local pin reads: 0 on the leader, else time since last leader contact.",
		}, func() float64 {
			if s.raft == nil {
				return 0
			}
			return s.Staleness().Seconds()
		}),
	}
}

func (m *metrics) register(r prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.writes, m.leaderChanges, m.applied, m.staleness} {
		if err := r.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// observeWrite records one write's latency under its outcome.
func (m *metrics) observeWrite(d time.Duration, err error) {
	outcome := "ok"
	switch {
	case err == nil:
	case errors.Is(err, ErrUnavailable):
		outcome = "unavailable"
	default:
		outcome = "error"
	}
	m.writes.WithLabelValues(outcome).Observe(d.Seconds())
}
