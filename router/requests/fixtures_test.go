package requests

import (
	"fmt"
	"testing"

	"github.com/prefixmesh/prefixmesh/cluster"
	"github.com/prefixmesh/prefixmesh/local"
	"github.com/prefixmesh/prefixmesh/routing"
)

// stairPicker is a PolicyPicker over nodes fake nodes, node i holding the first i/nodes of
// prompt's blocks (a staircase of prefix lengths), and the prompt: the fleet the decision
// benchmarks and the allocation test route over. The nodes come as the router lists them (the
// gossip mirror's snapshot through MirrorNodes), and passive health may eject them, as in
// Stack.
func stairPicker(tb testing.TB, nodes, tokens int) (*PolicyPicker, []uint32) {
	tb.Helper()
	const bs = 16
	toks := make([]uint32, tokens)
	for i := range toks {
		toks[i] = uint32(i*7919) % 100000
	}
	hashes := local.BlockHashes(toks, bs, 0)
	idx := routing.NewIndex(routing.DefaultIndexConfig())
	var snapshot fakeMirror // the mirror's snapshot: a node list that does not change
	for i := range nodes {
		id := fmt.Sprintf("node-%02d", i)
		snapshot = append(snapshot, cluster.NodeStatus{Synced: true,
			Meta: cluster.Meta{NodeID: id, EngineURL: "http://" + id, Model: simModel, BlockSize: bs}})
		idx.ReplaceNode(id, 1, 1, hashes[:i*len(hashes)/nodes])
	}
	src := MirrorNodes{M: snapshot}
	h, err := NewHealth(DefaultHealthConfig(), src, nil, nil)
	if err != nil {
		tb.Fatal(err)
	}
	return newPolicyPickerWith(tb, src, idx, PolicyPickerConfig{Ejector: h}), toks
}

// newPolicyPicker is the default prefixmesh PolicyPicker over src and idx.
func newPolicyPicker(tb testing.TB, src NodeSource, idx *routing.Index) *PolicyPicker {
	tb.Helper()
	return newPolicyPickerWith(tb, src, idx, PolicyPickerConfig{})
}

// newPolicyPickerWith is the default prefixmesh PolicyPicker over src and idx with cfg.
func newPolicyPickerWith(tb testing.TB, src NodeSource, idx *routing.Index, cfg PolicyPickerConfig) *PolicyPicker {
	tb.Helper()
	pol, err := routing.NewPolicy(routing.PolicyPrefixMesh, routing.DefaultPolicyConfig())
	if err != nil {
		tb.Fatal(err)
	}
	p, err := NewPolicyPicker(src, idx, routing.NewOverlay(0, 0), pol, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}
