package pins

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the store's Prometheus collectors, registered on the caller's registry.
type metrics struct {
	store         *Store
	writes        *prometheus.HistogramVec // by outcome
	leaderChanges prometheus.Counter
	// forwardRetries counts compare-and-set writes retried after an attempt with an unknown
	// outcome (a leader that froze or died mid-call).
	forwardRetries prometheus.Counter
	applied        prometheus.GaugeFunc
	staleness      prometheus.GaugeFunc
}

func newMetrics(s *Store) *metrics {
	return &metrics{
		store: s,
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
		forwardRetries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "prefixmesh_pins_write_retries_total",
			Help: "Compare-and-set writes retried after an attempt with an unknown outcome (leader froze, died or lost leadership mid-call).",
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
	// Every outcome exists from the start: a rate of failed writes reads 0, not "no data".
	for _, o := range []string{"ok", "unavailable", "error"} {
		m.writes.WithLabelValues(o)
	}
	for _, c := range []prometheus.Collector{m.writes, m.leaderChanges, m.forwardRetries, m.applied, m.staleness, voterCollector{s: m.store}} {
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

// voterCollector exports the Raft configuration at scrape time: prefixmesh_pins_voters (how
// many) and prefixmesh_pins_voter{server_id} = 1 per voter (which), plus whether this member
// leads. The label set is bounded by Config.Voters.
type voterCollector struct{ s *Store }

var (
	votersDesc = prometheus.NewDesc("prefixmesh_pins_voters", "Voters in the latest Raft configuration this member knows.", nil, nil)
	voterDesc  = prometheus.NewDesc("prefixmesh_pins_voter", "1 for every voter in the latest Raft configuration this member knows.", []string{"server_id"}, nil)
	leaderDesc = prometheus.NewDesc("prefixmesh_pins_is_leader", "1 while this member is the Raft leader.", nil, nil)
)

func (c voterCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- votersDesc
	ch <- voterDesc
	ch <- leaderDesc
}

func (c voterCollector) Collect(ch chan<- prometheus.Metric) {
	if c.s.raft == nil {
		return
	}
	m, err := c.s.Membership()
	if err != nil {
		return
	}
	n := 0
	for _, srv := range m.Servers {
		if srv.Voter {
			n++
			ch <- prometheus.MustNewConstMetric(voterDesc, prometheus.GaugeValue, 1, srv.ID)
		}
	}
	ch <- prometheus.MustNewConstMetric(votersDesc, prometheus.GaugeValue, float64(n))
	leader := 0.0
	if m.LeaderID == m.Self {
		leader = 1
	}
	ch <- prometheus.MustNewConstMetric(leaderDesc, prometheus.GaugeValue, leader)
}
