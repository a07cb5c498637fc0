package flow

import (
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
)

// Tenant label values beyond the first MaxTenantLabels distinct tenants are counted under
// tenantOther, so a client inventing tenant ids cannot grow the series without bound.
const (
	tenantOther = "other"
	tenantNone  = "none" // requests that name no tenant
)

// Dispatch paths (the path label of dispatched_total).
const (
	pathDirect = "direct" // not saturated: passed at once
	pathQueued = "queued" // waited in the queue
)

// Tenant outcomes (the outcome label of tenant_requests_total).
const (
	outcomeDispatched = "dispatched"
	outcomeShed       = "shed"
	outcomeCancelled  = "cancelled"
)

type metrics struct {
	queued     [NumClasses]prometheus.Gauge
	wait       [NumClasses]prometheus.Observer
	shed       [NumClasses][len(Reasons)]prometheus.Counter
	direct     [NumClasses]prometheus.Counter
	dequeued   [NumClasses]prometheus.Counter
	cancelled  [NumClasses]prometheus.Counter
	saturation *prometheus.GaugeVec

	tenantVec  *prometheus.CounterVec
	maxTenants int
	tenantMu   sync.Mutex                            // guards copies of tenants
	tenants    atomic.Pointer[map[string]*tenantSet] // read without a lock on the fast path
}

type tenantSet struct{ dispatched, shed, cancelled prometheus.Counter }

func newMetrics(reg prometheus.Registerer, maxTenants int) (*metrics, error) {
	m := &metrics{
		maxTenants: maxTenants,
		saturation: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "prefixmesh_flow_saturation",
			Help: "Mean saturation score over the nodes serving a model at the last read of the view (1 or more: saturated); \"\" is every node."}, []string{"model"}),
		tenantVec: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "prefixmesh_flow_tenant_requests_total",
			Help: "Requests through flow control by tenant (the first tenants seen, then other) and outcome."}, []string{"tenant", "outcome"}),
	}
	queued := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "prefixmesh_flow_queued_requests",
		Help: "Requests waiting in the flow control queue, by priority class."}, []string{"class"})
	wait := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "prefixmesh_flow_queue_wait_seconds",
		Help:    "Time queued requests waited before they were dispatched, by class.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 17)}, []string{"class"}) // 1 ms … ~65 s
	shed := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "prefixmesh_flow_shed_total",
		Help: "Requests shed by flow control (429), by class and reason."}, []string{"class", "reason"})
	disp := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "prefixmesh_flow_dispatched_total",
		Help: "Requests let through by flow control, by class and path (direct: not saturated; queued: after waiting)."}, []string{"class", "path"})
	canc := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "prefixmesh_flow_cancelled_total",
		Help: "Queued requests whose caller went away before they were dispatched, by class."}, []string{"class"})
	for c := range NumClasses {
		cl := Class(c).String()
		m.queued[c] = queued.WithLabelValues(cl)
		m.wait[c] = wait.WithLabelValues(cl)
		for r, reason := range Reasons {
			m.shed[c][r] = shed.WithLabelValues(cl, string(reason))
		}
		m.direct[c] = disp.WithLabelValues(cl, pathDirect)
		m.dequeued[c] = disp.WithLabelValues(cl, pathQueued)
		m.cancelled[c] = canc.WithLabelValues(cl)
	}
	empty := map[string]*tenantSet{}
	m.tenants.Store(&empty)
	m.tenant(tenantNone)
	m.tenant(tenantOther)
	if reg != nil {
		for _, c := range []prometheus.Collector{queued, wait, shed, disp, canc, m.saturation, m.tenantVec} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

func reasonIndex(r Reason) int {
	for i, x := range Reasons {
		if x == r {
			return i
		}
	}
	return 0
}

// tenant returns the tenant's counters: its own among the first maxTenants seen, other's
// after. The lookup is a map read through an atomic pointer; a new tenant copies the map.
func (m *metrics) tenant(key string) *tenantSet {
	if key == "" {
		key = tenantNone
	}
	cur := *m.tenants.Load()
	if ts := cur[key]; ts != nil {
		return ts
	}
	// Past the cap every new tenant is other's, without the lock: a client inventing a tenant
	// per request does not serialise the fast path.
	if len(cur) >= m.maxTenants+2 || !utf8.ValidString(key) {
		if ts := cur[tenantOther]; ts != nil {
			return ts
		}
	}
	m.tenantMu.Lock()
	defer m.tenantMu.Unlock()
	cur = *m.tenants.Load()
	if ts := cur[key]; ts != nil {
		return ts
	}
	label := key
	// none and other are not counted among the tenants; a value Prometheus cannot carry
	// (not UTF-8) is other.
	if len(cur) >= m.maxTenants+2 || !utf8.ValidString(key) {
		label = tenantOther
		if ts := cur[tenantOther]; ts != nil {
			return ts
		}
	}
	ts := &tenantSet{dispatched: m.tenantVec.WithLabelValues(label, outcomeDispatched),
		shed: m.tenantVec.WithLabelValues(label, outcomeShed), cancelled: m.tenantVec.WithLabelValues(label, outcomeCancelled)}
	next := make(map[string]*tenantSet, len(cur)+1)
	for k, v := range cur {
		next[k] = v
	}
	next[label] = ts
	m.tenants.Store(&next)
	return ts
}
