package agentd

import (
	"github.com/prometheus/client_golang/prometheus"
)

// registerInfo exports prefixmesh_node_info{role,kv_connector} = 1: the serving role and KV
// connector this agent gossips, on its own /metrics, so that a pool's pods can be checked (and
// joined to other series) without a router's view.
func registerInfo(reg prometheus.Registerer, cfg Config) error {
	role, conn, _ := cfg.serving()
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "prefixmesh_node_info",
		Help:        "1, labelled with the node's serving role (prefill, decode, both) and KV connector (none, nixl, sglang), as it gossips them.",
		ConstLabels: prometheus.Labels{"role": role.String(), "kv_connector": conn.String()}})
	g.Set(1)
	return reg.Register(g)
}
