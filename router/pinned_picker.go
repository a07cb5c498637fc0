package router

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/prefixmesh/prefixmesh/router/requests"
	"github.com/prefixmesh/prefixmesh/routing"
)

// PinnedPicker makes the request service's Picker respect placement pins: for a pinned adapter
// the request's allowed set (PickRequest.Allowed) becomes the adapter's pin set, intersected
// with any set it already had (a gateway's subset hint), so the policy chooses among the pinned
// nodes only (and answers ErrNoNodes when none of them can serve); unpinned adapters pass through
// unchanged. The pin table is read locally per request and the set built once, O(pins): the
// picker tests each node against it in O(1) as it lists the nodes, so a node that joins
// mid-request is judged like any other. Should a picker that ignores Allowed choose a node
// outside the pins, the pick is given back and the request re-picked without it, so a pinned
// adapter never leaves its nodes. Nodes names the nodes for the error when none is pinned.
type PinnedPicker struct {
	Picker requests.Picker
	Nodes  requests.NodeSource
	Pins   PinTable
}

var _ requests.Picker = PinnedPicker{}

// Pick implements requests.Picker.
func (p PinnedPicker) Pick(ctx context.Context, req *requests.PickRequest, exclude []string) (requests.Pick, error) {
	allowed, pinned := allowedFilter(p.Pins, req.AdapterID)
	if allowed == nil {
		return p.Picker.Pick(ctx, req, exclude)
	}
	if req.Allowed != nil {
		both := routing.NewNodeSet()
		for _, id := range pinned {
			if req.Allowed.Has(id) {
				both.Add(id)
			}
		}
		allowed = both
	}
	r := *req
	r.Allowed = allowed
	ex := slices.Clip(exclude)
	for range maxRepicks {
		pick, err := p.Picker.Pick(ctx, &r, ex)
		if errors.Is(err, requests.ErrNoNodes) {
			return pick, fmt.Errorf("%w: adapter %d is pinned to %v: %w", requests.ErrNoNodes, req.AdapterID, pinned, err)
		}
		if err != nil || allowed.Has(pick.NodeID) {
			return pick, err
		}
		pick.Done(requests.Outcome{CachedTokens: -1}) // never sent: give the load back
		ex = append(ex, pick.NodeID)
	}
	return requests.Pick{}, fmt.Errorf("%w: adapter %d is pinned to %v; the picker kept choosing other nodes", requests.ErrNoNodes, req.AdapterID, pinned)
}

// maxRepicks bounds re-picks after a picker chose a node outside the pins (one that ignores
// PickRequest.Allowed): each re-pick excludes one more node, and a handful is plenty.
const maxRepicks = 4

// Models implements requests.Picker.
func (p PinnedPicker) Models() []string { return p.Picker.Models() }
