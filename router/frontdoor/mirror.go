package frontdoor

import (
	"time"

	"github.com/prefixmesh/prefixmesh/cluster"
	"github.com/prefixmesh/prefixmesh/routing"
)

// Mirror is the gossip mirror's node list (*cluster.Mirror).
type Mirror interface {
	Nodes() []cluster.NodeStatus
}

var _ Mirror = (*cluster.Mirror)(nil)

// MirrorNodes adapts the gossip mirror to NodeSource, the way router.View reads it: every node
// the mirror has synced at least once (a node still loading its first summary has no estimate
// yet, so routing to it would be blind), with an engine URL, its reported load and the age the
// router measured on receipt. The router's own in-flight counts are added by PolicyPicker.
type MirrorNodes struct {
	M   Mirror
	Now func() time.Time // nil: time.Now
}

var (
	_ NodeSource   = MirrorNodes{}
	_ NodeAppender = MirrorNodes{}
)

// Nodes implements NodeSource.
func (m MirrorNodes) Nodes() []NodeTarget {
	t, st := m.now(), m.M.Nodes()
	out := make([]NodeTarget, 0, len(st))
	for i := range st {
		if n := &st[i]; listed(n) {
			out = append(out, NodeTarget{EngineURL: n.Meta.EngineURL, Info: mirrorInfo(n, t)})
		}
	}
	return out
}

// AppendEligible implements NodeAppender.
func (m MirrorNodes) AppendEligible(infos []routing.NodeInfo, urls []string, el *routing.Eligibility) ([]routing.NodeInfo, []string) {
	t, st := m.now(), m.M.Nodes()
	for i := range st {
		n := &st[i]
		if !listed(n) {
			continue
		}
		if in := mirrorInfo(n, t); el.Eligible(&in) {
			infos, urls = append(infos, in), append(urls, n.Meta.EngineURL)
		}
	}
	return infos, urls
}

func (m MirrorNodes) now() time.Time {
	if m.Now != nil {
		return m.Now()
	}
	return time.Now()
}

// listed is whether the router routes to n at all: synced once, with an engine URL.
func listed(n *cluster.NodeStatus) bool { return n.Synced && n.Meta.EngineURL != "" }

// mirrorInfo is the routing view of a mirrored node at t.
func mirrorInfo(n *cluster.NodeStatus, t time.Time) routing.NodeInfo {
	age := time.Duration(0)
	if !n.LoadRecv.IsZero() {
		age = t.Sub(n.LoadRecv)
	}
	return routing.NodeInfo{
		ID:                  n.Meta.NodeID,
		Alive:               true,
		Draining:            n.Meta.Draining,
		Cold:                n.Meta.Cold,
		Model:               n.Meta.Model,
		QueuedPrefillTokens: int(n.Load.QueuedPrefillTokens),
		Running:             int(n.Load.Running),
		Waiting:             int(n.Load.Waiting),
		FreeBlocks:          int(n.Load.FreeBlocks),
		CapacityBlocks:      int(n.Meta.KVCapacity),
		LoadAge:             age,
		BlockSize:           int(n.Meta.BlockSize),
	}
}
