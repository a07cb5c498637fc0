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

var _ NodeSource = MirrorNodes{}

// Nodes implements NodeSource.
func (m MirrorNodes) Nodes() []NodeTarget {
	now := time.Now
	if m.Now != nil {
		now = m.Now
	}
	t := now()
	st := m.M.Nodes()
	out := make([]NodeTarget, 0, len(st))
	for _, n := range st {
		if !n.Synced || n.Meta.EngineURL == "" {
			continue
		}
		age := time.Duration(0)
		if !n.LoadRecv.IsZero() {
			age = t.Sub(n.LoadRecv)
		}
		out = append(out, NodeTarget{EngineURL: n.Meta.EngineURL, Info: routing.NodeInfo{
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
		}})
	}
	return out
}
