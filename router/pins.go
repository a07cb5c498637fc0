package router

import (
	"sync/atomic"

	"github.com/prefixmesh/prefixmesh/routing"
)

// PinTable answers placement pins (docs/architecture.md, "Pins"): the nodes an adapter's requests may go to, and
// whether the adapter is pinned at all (false: any node). *pins.Store and *pins.Mirror implement
// it with local reads, so routing never waits on Raft and keeps working without quorum.
type PinTable interface {
	AllowedNodes(adapterID uint64) (nodes []string, pinned bool)
}

// SwitchPins is a PinTable whose source can be set later (the router's Raft store starts after
// gossip has found its peers; a non-voter follows another router). Until Set, and after
// Set(nil), every adapter is unpinned. It is safe for concurrent use.
type SwitchPins struct {
	cur atomic.Pointer[pinTableBox]
}

type pinTableBox struct{ t PinTable }

var _ PinTable = (*SwitchPins)(nil)

// Set makes t the source of answers.
func (s *SwitchPins) Set(t PinTable) {
	if t == nil {
		s.cur.Store(nil)
		return
	}
	s.cur.Store(&pinTableBox{t})
}

// AllowedNodes implements PinTable.
func (s *SwitchPins) AllowedNodes(adapterID uint64) ([]string, bool) {
	b := s.cur.Load()
	if b == nil {
		return nil, false
	}
	return b.t.AllowedNodes(adapterID)
}

// allowedFilter returns the eligibility filter for adapterID's pins: nil (every node) when pins
// is nil or the adapter is unpinned, else membership in the pinned node set, built once here so
// that each node's test is O(1) (a scan of the pin list per node made a pick quadratic).
func allowedFilter(pins PinTable, adapterID uint64) (allowed *routing.NodeSet, pinned []string) {
	if pins == nil {
		return nil, nil
	}
	nodes, ok := pins.AllowedNodes(adapterID)
	if !ok {
		return nil, nil
	}
	return routing.NewNodeSet(nodes...), nodes
}
