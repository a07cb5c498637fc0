package router

import (
	"slices"
	"time"

	"github.com/prefixmesh/prefixmesh/cluster"
	"github.com/prefixmesh/prefixmesh/local"
	"github.com/prefixmesh/prefixmesh/router/requests"
	"github.com/prefixmesh/prefixmesh/routing"
)

// NodeStatusSource lists the nodes with their metadata and load, as the view reads them:
// *cluster.SummaryMirror.
type NodeStatusSource interface {
	Nodes() []cluster.NodeStatus
}

// Estimator answers matched blocks per node: *routing.Index.
type Estimator interface {
	Estimate(hashes []uint64, nodes []string, matchedBlocks []int)
}

var (
	_ NodeStatusSource = (*cluster.SummaryMirror)(nil)
	_ Estimator        = (*routing.Index)(nil)
)

// View is the router's view of the nodes: who is there, their load, and their cache estimates.
// It is safe for concurrent use.
type View struct {
	mirror NodeStatusSource
	index  Estimator
	now    func() time.Time
}

// NewView returns a view over a mirror and the index it feeds.
func NewView(m NodeStatusSource, idx Estimator) *View {
	return &View{mirror: m, index: idx, now: time.Now}
}

// Snapshot is the view for one request; reuse it across requests to avoid allocation. The
// slices Nodes, Meta and MatchedTokens are parallel.
type Snapshot struct {
	Nodes         []routing.NodeInfo
	Meta          []cluster.Meta
	MatchedTokens []int
	// Hashes are the prompt's block hashes at BlockSize, the block size most nodes use (the
	// policies' tie-break key).
	Hashes    []uint64
	BlockSize int

	ids     []string
	blocks  []int
	scratch []uint64
	sizes   []sizeCount
}

// sizeCount is how many nodes use one block size.
type sizeCount struct{ size, n int }

func (s *Snapshot) countSize(bs int) {
	for i := range s.sizes {
		if s.sizes[i].size == bs {
			s.sizes[i].n++
			return
		}
	}
	s.sizes = append(s.sizes, sizeCount{bs, 1})
}

// Nodes fills s.Nodes and s.Meta (not the estimates) with every node the mirror has synced at
// least once, its reported load and the age the router measured on receipt: the candidates a
// routing.Decider estimates and chooses among.
func (v *View) Nodes(s *Snapshot) {
	now := v.now()
	s.Nodes, s.Meta, s.MatchedTokens = s.Nodes[:0], s.Meta[:0], s.MatchedTokens[:0]
	for _, n := range v.mirror.Nodes() {
		if !n.Synced {
			continue
		}
		s.Nodes = append(s.Nodes, nodeInfo(&n, now))
		s.Meta = append(s.Meta, n.Meta)
	}
}

// nodeInfo is the routing view of a mirrored node at now (requests.SetNodeInfo, the one
// translation every door uses).
func nodeInfo(n *cluster.NodeStatus, now time.Time) routing.NodeInfo {
	var in routing.NodeInfo
	requests.SetNodeInfo(&in, n, now)
	return in
}

// For fills s for a prompt: every node the mirror has synced at least once (a node still
// loading its first summary has no estimate yet and is left out), its reported load with the
// age the router measured on receipt, and its estimated matched tokens.
func (v *View) For(tokens []uint32, adapterID uint64, s *Snapshot) {
	now := v.now()
	s.Nodes, s.Meta, s.MatchedTokens = s.Nodes[:0], s.Meta[:0], s.MatchedTokens[:0]
	s.sizes = s.sizes[:0]
	for _, n := range v.mirror.Nodes() {
		if !n.Synced {
			continue
		}
		m := n.Meta
		s.Nodes = append(s.Nodes, nodeInfo(&n, now))
		s.Meta = append(s.Meta, m)
		s.MatchedTokens = append(s.MatchedTokens, 0)
		s.countSize(int(m.BlockSize))
	}
	// The request's block size is the one most nodes use (ties: the smaller).
	s.BlockSize, s.Hashes = 0, s.Hashes[:0]
	best := 0
	for _, c := range s.sizes {
		if c.size > 0 && (c.n > best || (c.n == best && c.size < s.BlockSize)) {
			s.BlockSize, best = c.size, c.n
		}
	}
	// One hash chain and one index walk per block size in use (normally one).
	for _, c := range s.sizes {
		bs := c.size
		if bs <= 0 {
			continue
		}
		s.ids = s.ids[:0]
		for i := range s.Nodes {
			if s.Nodes[i].BlockSize == bs {
				s.ids = append(s.ids, s.Nodes[i].ID)
			}
		}
		s.scratch = local.AppendBlockHashes(s.scratch[:0], tokens, bs, adapterID)
		if bs == s.BlockSize {
			s.Hashes = append(s.Hashes, s.scratch...)
		}
		s.blocks = slices.Grow(s.blocks[:0], len(s.ids))[:len(s.ids)]
		v.index.Estimate(s.scratch, s.ids, s.blocks)
		j := 0
		for i := range s.Nodes {
			if s.Nodes[i].BlockSize == bs {
				if !s.Nodes[i].Cold { // a summary that may over-estimate: no estimate (as routing.Decider)
					s.MatchedTokens[i] = s.blocks[j] * bs
				}
				j++
			}
		}
	}
}
