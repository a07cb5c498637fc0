package requests

import (
	"time"

	"github.com/prefixmesh/prefixmesh/cluster"
	"github.com/prefixmesh/prefixmesh/routing"
)

// NodeStatusSource lists the nodes with their metadata and load: the gossip mirror
// (*cluster.SummaryMirror), which MirrorNodes adapts to NodeSource.
type NodeStatusSource interface {
	Nodes() []cluster.NodeStatus
}

var _ NodeStatusSource = (*cluster.SummaryMirror)(nil)

// MirrorNodes adapts the gossip mirror to NodeSource, the way router.View reads it: every node
// the mirror has synced at least once (a node still loading its first summary has no estimate
// yet, so routing to it would be blind), with an engine URL, its reported load and the age the
// router measured on receipt. The router's own in-flight counts are added by PolicyPicker.
type MirrorNodes struct {
	M   NodeStatusSource
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
			out = append(out, NodeTarget{EngineURL: n.Meta.EngineURL})
			SetNodeInfo(&out[len(out)-1].Info, n, t)
		}
	}
	return out
}

// AppendEligible implements NodeAppender.
func (m MirrorNodes) AppendEligible(infos []routing.NodeInfo, urls []string, el routing.Eligibility) ([]routing.NodeInfo, []string) {
	t, st := m.now(), m.M.Nodes()
	for i := range st {
		n := &st[i]
		if !listed(n) {
			continue
		}
		// Built in place, and taken back if el refuses it: a NodeInfo is 168 bytes.
		infos = append(infos, routing.NodeInfo{})
		in := &infos[len(infos)-1]
		SetNodeInfo(in, n, t)
		if !el.Eligible(in) {
			infos = infos[:len(infos)-1]
			continue
		}
		urls = append(urls, n.Meta.EngineURL)
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

// SetNodeInfo fills in, a zero NodeInfo, with the routing view of a mirrored node at t (field
// by field: the NodeInfo is already in place in the caller's slice).
func SetNodeInfo(in *routing.NodeInfo, n *cluster.NodeStatus, t time.Time) {
	if !n.LoadRecv.IsZero() {
		in.LoadAge = t.Sub(n.LoadRecv)
	}
	in.ID, in.Alive, in.Draining, in.Cold, in.Model = n.Meta.NodeID, true, n.Meta.Draining, n.Meta.Cold, n.Meta.Model
	in.QueuedPrefillTokens, in.Running, in.Waiting = int(n.Load.QueuedPrefillTokens), int(n.Load.Running), int(n.Load.Waiting)
	in.FreeBlocks, in.CapacityBlocks, in.BlockSize = int(n.Load.FreeBlocks), int(n.Meta.KVCapacity), int(n.Meta.BlockSize)
	in.Role = routingRole(n.Meta.Serving)
}

// routingRole is the routing package's name for a gossiped serving role; a role of a later
// release is treated as both (it serves whole requests until this router knows better).
func routingRole(r cluster.ServingRole) routing.Role {
	switch r {
	case cluster.ServePrefill:
		return routing.RolePrefill
	case cluster.ServeDecode:
		return routing.RoleDecode
	}
	return routing.RoleBoth
}
