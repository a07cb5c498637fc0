package router

import (
	"sync"
	"time"

	"github.com/prefixmesh/prefixmesh/router/flow"
	"github.com/prefixmesh/prefixmesh/routing"
)

// FlowSource is flow control's view of the fleet (flow.Source): the same view the decisions
// read (synced nodes, their load reports and the age of each on receipt) plus the in-flight
// counts of the shared decision path (this router's and its peers'), so that saturation is
// judged on what the router itself believes, with no poll of its own.
type FlowSource struct {
	View    *View
	Decider *routing.Decider
	// Ejected, when set, leaves out the nodes passive health has ejected: they take no request.
	Ejected func(string) bool

	mu   sync.Mutex // guards snap, shared by the pools' reads
	snap Snapshot
}

var _ flow.Source = (*FlowSource)(nil)

// AppendLoads implements flow.Source: the nodes that take requests (not draining, not
// ejected) and serve model, every such node when model is "".
func (f *FlowSource) AppendLoads(dst []flow.NodeLoad, model string) []flow.NodeLoad {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.View.Nodes(&f.snap)
	now := time.Now()
	// The decisions' own predicate: a node flow control counts is one a request could be sent to.
	el := routing.Eligibility{Model: model, Ejected: f.Ejected}
	for i := range f.snap.Nodes {
		n := &f.snap.Nodes[i]
		if !el.Eligible(n) {
			continue
		}
		dst = append(dst, flow.NodeLoad{Waiting: n.Waiting, Running: n.Running, FreeBlocks: n.FreeBlocks,
			CapacityBlocks: n.CapacityBlocks, LoadAge: n.LoadAge, InFlight: f.Decider.TotalInFlight(n.ID, now).Requests})
	}
	return dst
}
