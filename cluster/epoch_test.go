package cluster

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/prefixmesh/prefixmesh/local"
)

// A node whose cache is replaced by an empty one while the agent keeps running (a mirrored
// engine restarted) moves to a new epoch with SetEpoch. With every delta to the router dropped,
// so that no removal can reach it through the stream, the router still drops the old cache's
// blocks as soon as it sees the new epoch and syncs the new cache by a repair; from then on it
// never credits the old blocks, and deltas stamped with the new epoch apply again.
func TestAgentSetEpoch(t *testing.T) {
	routers, nodes := startCluster(t, 1, 1)
	r, n := routers[0], nodes[0]
	var blk uint32
	old, fresh, later := prompt(1, 1, 0, 96), prompt(2, 1, 0, 96), prompt(3, 1, 0, 96)
	insert(n.tree, old, &blk)
	waitFor(t, settle, "old cache mirrored", func() (bool, string) { return agree(routers, nodes, [][]uint32{old}) })
	oldEpoch := n.agent.Meta().Epoch

	r.fault.budget.Store(1 << 30)
	r.fault.mode.Store(faultDrop)
	n.tree.Evict(1 << 20) // the engine's cache is gone …
	insert(n.tree, fresh, &blk)
	e := n.srv.NewEpoch() // … and only then the epoch moves: GetSummary answers with it
	if err := n.agent.SetEpoch(e); err != nil {
		t.Fatal(err)
	}
	if m := n.agent.Meta(); m.Epoch != e || e == oldEpoch {
		t.Fatalf("meta epoch %#x after SetEpoch(%#x), old %#x", m.Epoch, e, oldEpoch)
	}
	if err := n.agent.SetEpoch(0); err == nil {
		t.Fatal("SetEpoch(0) accepted")
	}

	ids, got := []string{n.id}, make([]int, 1)
	est := func(p []uint32) int {
		r.idx.Estimate(local.BlockHashes(p, testBlockSize, 0), ids, got)
		return got[0] * testBlockSize
	}
	waitFor(t, settle, "new epoch synced", func() (bool, string) {
		ns := r.agent.Mirror().Nodes()
		if len(ns) != 1 || ns[0].Meta.Epoch != e {
			return false, "router still at the old epoch"
		}
		// Seen the new epoch: the old blocks are gone at once, whatever the repair's progress.
		if o := est(old); o != 0 {
			t.Fatalf("router credits %d tokens of the old epoch after seeing the new one", o)
		}
		epoch, _, _, ok := r.idx.NodeState(n.id)
		if !ok || epoch != e || est(fresh) != 96 {
			return false, fmt.Sprintf("index epoch %#x (ok=%v), fresh estimate %d", epoch, ok, est(fresh))
		}
		return true, ""
	})
	if repairs(r.agent, "epoch") == 0 {
		t.Fatal("no repair for the new epoch")
	}

	// The stream works again under the new epoch.
	r.fault.mode.Store(faultNone)
	insert(n.tree, later, &blk)
	waitFor(t, settle, "delta of the new epoch", func() (bool, string) {
		return agree(routers, nodes, [][]uint32{old, fresh, later})
	})
	waitFor(t, settle, "caught up", func() (bool, string) { return caughtUp(routers, nodes) })
}

// SetCold flags the node in its gossiped metadata: the router's node list shows it (and counts
// it in prefixmesh_gossip_cold_nodes) until SetCold(false), and Draining is left alone.
func TestAgentSetCold(t *testing.T) {
	routers, nodes := startCluster(t, 1, 1)
	r, n := routers[0], nodes[0]
	check := func(want bool) {
		t.Helper()
		waitFor(t, settle, fmt.Sprintf("cold=%v at the router", want), func() (bool, string) {
			ns := r.agent.Mirror().Nodes()
			if len(ns) != 1 || ns[0].Meta.Cold != want || ns[0].Meta.Draining {
				return false, fmt.Sprintf("router sees %+v", ns)
			}
			if g := testutil.ToFloat64(r.agent.metrics.coldNodes); g != map[bool]float64{false: 0, true: 1}[want] {
				return false, fmt.Sprintf("cold nodes gauge %v", g)
			}
			return true, ""
		})
	}
	check(false)
	if err := n.agent.SetCold(true); err != nil {
		t.Fatal(err)
	}
	if !n.agent.Meta().Cold {
		t.Fatal("meta not cold after SetCold(true)")
	}
	check(true)
	if err := n.agent.SetCold(false); err != nil {
		t.Fatal(err)
	}
	check(false)
}
