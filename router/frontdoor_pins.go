package router

import (
	"context"
	"fmt"
	"slices"

	"github.com/prefixmesh/prefixmesh/router/frontdoor"
)

// PinnedPicker makes a front-door Picker respect placement pins: for a pinned adapter every node
// the source lists outside the adapter's pin set is added to the picker's exclusions, so the
// policy chooses among the pinned nodes only (and answers ErrNoNodes when none of them can
// serve); unpinned adapters pass through unchanged. The pin table is read locally per request.
// Nodes should be the source the wrapped picker reads. A node that joins between the two reads
// of one request is not in the exclusions (the picker's NodeSource sees no request, so the
// filter cannot live there); should the picker choose it, the pick is given back and the
// request re-picked without it, so a pinned adapter never leaves its nodes.
type PinnedPicker struct {
	Picker frontdoor.Picker
	Nodes  frontdoor.NodeSource
	Pins   PinTable
}

var _ frontdoor.Picker = PinnedPicker{}

// Pick implements frontdoor.Picker.
func (p PinnedPicker) Pick(ctx context.Context, req *frontdoor.PickRequest, exclude []string) (frontdoor.Pick, error) {
	allowed, pinned := allowedFilter(p.Pins, req.AdapterID)
	if allowed == nil {
		return p.Picker.Pick(ctx, req, exclude)
	}
	ex := slices.Clip(exclude)
	some := false
	for _, n := range p.Nodes.Nodes() {
		if allowed(n.Info.ID) {
			some = true
		} else if !slices.Contains(ex, n.Info.ID) {
			ex = append(ex, n.Info.ID)
		}
	}
	if !some {
		return frontdoor.Pick{}, fmt.Errorf("%w: adapter %d is pinned to %v, none of which is known", frontdoor.ErrNoNodes, req.AdapterID, pinned)
	}
	for range maxRepicks {
		pick, err := p.Picker.Pick(ctx, req, ex)
		if err != nil || allowed(pick.NodeID) {
			return pick, err
		}
		pick.Done(frontdoor.Outcome{CachedTokens: -1}) // never sent: give the load back
		ex = append(ex, pick.NodeID)
	}
	return frontdoor.Pick{}, fmt.Errorf("%w: adapter %d is pinned to %v; the picker kept choosing other nodes", frontdoor.ErrNoNodes, req.AdapterID, pinned)
}

// maxRepicks bounds re-picks after a node that joined mid-request was chosen: each needs a new
// node to appear between two reads of the node list microseconds apart, so a handful is plenty.
const maxRepicks = 4

// Models implements frontdoor.Picker.
func (p PinnedPicker) Models() []string { return p.Picker.Models() }
