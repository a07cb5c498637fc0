package frontdoor

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixmesh/prefixmesh/router/requests"
)

// nodeSeries is the set of "node" label values across the registry's series.
func nodeSeries(t *testing.T, reg *prometheus.Registry) map[string]bool {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "node" {
					ids[l.GetValue()] = true
				}
			}
		}
	}
	return ids
}

// A thousand node ids that came, failed, were ejected and left leave nothing behind once the
// view no longer lists them: the per-node series hold the present nodes only (the health table
// forgets them too: requests' TestChurnedNodesAreForgotten).
func TestChurnedNodesAreForgotten(t *testing.T) {
	f := startFleet(t, fleetOpts{nodes: 2})
	f.health.OnSweep(f.fd.ForgetDeparted)
	present := f.list.Nodes()
	churned := append([]requests.NodeTarget(nil), present...)
	for i := range 1000 {
		churned = append(churned, target(fmt.Sprintf("churn-%04d", i), "http://127.0.0.1:1"))
	}
	f.list.set(churned)
	for _, n := range churned[2:] {
		for range requests.DefaultHealthConfig().EjectAfter {
			f.health.ReportFailure(n.Info.ID)
		}
		f.fd.ObserveEjection(n.Info.ID)
		f.fd.met.decisions.WithLabelValues(n.Info.ID, "prefixmesh", "test").Inc()
	}
	f.fd.met.decisions.WithLabelValues(present[0].Info.ID, "prefixmesh", "test").Inc()

	f.list.set(present) // the churned nodes leave the view
	f.health.Sweep()
	ids := nodeSeries(t, f.reg)
	for id := range ids {
		if id != present[0].Info.ID && id != present[1].Info.ID {
			t.Errorf("a series still names departed node %s (%d node ids in all)", id, len(ids))
			break
		}
	}
	if !ids[present[0].Info.ID] {
		t.Errorf("the present node %s lost its series", present[0].Info.ID)
	}
}
