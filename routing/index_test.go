package routing

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
)

func TestIndexApplyReplaceRemove(t *testing.T) {
	x := NewIndex(DefaultIndexConfig())
	chain := []uint64{10, 11, 12, 13}
	x.ReplaceNode("a", 7, 5, chain[:2])
	x.ReplaceNode("b", 9, 1, chain)
	got := make([]int, 3)
	x.Estimate(chain, []string{"a", "b", "zz"}, got)
	if fmt.Sprint(got) != "[2 4 0]" {
		t.Fatalf("estimate %v", got)
	}
	// a: add 12, 13 then remove 13 in one delta -> 3 blocks.
	ev := []Change{{12, true}, {13, true}, {13, false}}
	if err := x.ApplyDelta("a", 7, 5, 8, ev); err != nil {
		t.Fatal(err)
	}
	x.Estimate(chain, []string{"a", "b", "zz"}, got)
	if fmt.Sprint(got) != "[3 4 0]" {
		t.Fatalf("after delta %v", got)
	}
	if e, s, b, ok := x.NodeState("a"); !ok || e != 7 || s != 8 || b != 3 {
		t.Fatalf("state %d %d %d %v", e, s, b, ok)
	}
	// Replace drops what was known first.
	x.ReplaceNode("a", 8, 0, []uint64{99})
	x.Estimate(chain, []string{"a"}, got)
	if got[0] != 0 {
		t.Fatalf("after replace %d", got[0])
	}
	if st := x.Stats(); st.Pairs != 5 || st.Nodes != 2 || st.DistinctHashes != 5 {
		t.Fatalf("stats %+v", st)
	}
	x.RemoveNode("b")
	x.RemoveNode("b") // idempotent
	x.Estimate(chain, []string{"a", "b"}, got)
	if got[0] != 0 || got[1] != 0 {
		t.Fatalf("after remove %v", got[:2])
	}
	if st := x.Stats(); st.Pairs != 1 || st.Nodes != 1 {
		t.Fatalf("stats %+v", st)
	}
	if _, _, _, ok := x.NodeState("b"); ok {
		t.Fatal("b still known")
	}
}

func TestIndexDeltaErrors(t *testing.T) {
	x := NewIndex(DefaultIndexConfig())
	add := []Change{{1, true}}
	if err := x.ApplyDelta("a", 1, 0, 1, add); !errors.Is(err, ErrUnknownNode) {
		t.Fatalf("unknown: %v", err)
	}
	x.ReplaceNode("a", 1, 10, nil)
	tests := []struct {
		name          string
		epoch, fr, to uint64
		want          error
		wantSeq       uint64
		wantBlocks    int
	}{
		{"epoch", 2, 10, 11, ErrEpoch, 10, 0},
		{"gap", 1, 11, 12, ErrGap, 10, 0},
		{"inverted", 1, 12, 11, ErrInvalid, 10, 0},
		{"duplicate", 1, 9, 10, nil, 10, 0},
		{"old duplicate", 1, 2, 3, nil, 10, 0},
		{"in order", 1, 10, 11, nil, 11, 1},
		{"overlap applies whole", 1, 10, 12, nil, 12, 1},
		{"same again is duplicate", 1, 11, 12, nil, 12, 1},
	}
	for _, tc := range tests {
		err := x.ApplyDelta("a", tc.epoch, tc.fr, tc.to, add)
		if !sameErr(err, tc.want) {
			t.Fatalf("%s: err %v, want %v", tc.name, err, tc.want)
		}
		if _, s, b, _ := x.NodeState("a"); s != tc.wantSeq || b != tc.wantBlocks {
			t.Fatalf("%s: seq %d blocks %d, want %d %d", tc.name, s, b, tc.wantSeq, tc.wantBlocks)
		}
	}
	// A duplicate delta must change nothing even if its events would.
	if err := x.ApplyDelta("a", 1, 0, 5, []Change{{1, false}}); err != nil {
		t.Fatal(err)
	}
	if _, _, b, _ := x.NodeState("a"); b != 1 {
		t.Fatalf("duplicate changed blocks to %d", b)
	}
}

func TestIndexMaxPairs(t *testing.T) {
	const max = 100
	x := NewIndex(IndexConfig{MaxPairs: max})
	chain := make([]uint64, 80)
	for i := range chain {
		chain[i] = uint64(1000 + i)
	}
	x.ReplaceNode("a", 1, 0, chain)
	x.ReplaceNode("b", 1, 0, chain) // only 20 fit
	st := x.Stats()
	if st.Pairs != max || st.RefusedAdds != 60 {
		t.Fatalf("stats %+v", st)
	}
	if ns, _ := x.NodeStats("b"); ns.Blocks != 20 || ns.RefusedAdds != 60 {
		t.Fatalf("b %+v", ns)
	}
	got := make([]int, 2)
	x.Estimate(chain, []string{"a", "b"}, got)
	if got[0] != 80 || got[1] != 20 {
		t.Fatalf("estimate %v: b must under-report, never over-report", got)
	}
	// Deltas over the bound are refused too.
	if err := x.ApplyDelta("b", 1, 0, 1, []Change{{5000, true}}); err != nil {
		t.Fatal(err)
	}
	if st := x.Stats(); st.Pairs != max || st.RefusedAdds != 61 {
		t.Fatalf("stats %+v", st)
	}
	// Freeing room lets adds through again.
	x.RemoveNode("a")
	if err := x.ApplyDelta("b", 1, 1, 2, []Change{{chain[20], true}}); err != nil {
		t.Fatal(err)
	}
	x.Estimate(chain, []string{"a", "b"}, got)
	if got[0] != 0 || got[1] != 21 {
		t.Fatalf("estimate %v", got)
	}
}

func TestIndexSlotsBeyond64Nodes(t *testing.T) {
	x := NewIndex(DefaultIndexConfig())
	r := newRefIndex(DefaultMaxPairs)
	chain := []uint64{1, 2, 3, 4, 5, 6, 7, 8}
	var ids []string
	for i := 0; i < 150; i++ {
		id := fmt.Sprintf("n%03d", i)
		ids = append(ids, id)
		x.ReplaceNode(id, 1, 0, chain[:i%9])
		r.replace(id, 1, 0, chain[:i%9])
	}
	for i := 0; i < 150; i += 3 {
		x.RemoveNode(ids[i])
		r.removeNode(ids[i])
	}
	for i := 0; i < 150; i += 6 { // reuse freed slots
		x.ReplaceNode(ids[i], 2, 0, chain[:8-i%9])
		r.replace(ids[i], 2, 0, chain[:8-i%9])
	}
	if err := compareIndex(x, r, [][]uint64{chain, chain[:3], {9}, nil}, append(ids, "ghost")); err != nil {
		t.Fatal(err)
	}
}

// randomWorld is a forest of hash chains: chains share prefixes the way conversations share
// system prompts, so estimates stop at many different depths.
type randomWorld struct {
	rng    *rand.Rand
	chains [][]uint64
	ids    []string
}

func newRandomWorld(seed uint64, nChains, nNodes int) *randomWorld {
	w := &randomWorld{rng: rand.New(rand.NewPCG(seed, 1))}
	next := uint64(1)
	for i := 0; i < nChains; i++ {
		var c []uint64
		if i > 0 && w.rng.IntN(3) > 0 {
			p := w.chains[w.rng.IntN(len(w.chains))]
			c = append(c, p[:w.rng.IntN(len(p)+1)]...)
		}
		for n := 1 + w.rng.IntN(12); n > 0; n-- {
			c = append(c, next)
			next++
		}
		w.chains = append(w.chains, c)
	}
	for i := 0; i < nNodes; i++ {
		w.ids = append(w.ids, fmt.Sprintf("node-%d", i))
	}
	return w
}

// someHashes returns a random subset of prefixes of random chains, sometimes with holes.
func (w *randomWorld) someHashes() []uint64 {
	var out []uint64
	for k := w.rng.IntN(6); k > 0; k-- {
		c := w.chains[w.rng.IntN(len(w.chains))]
		c = c[:w.rng.IntN(len(c)+1)]
		for _, h := range c {
			if w.rng.IntN(10) > 0 {
				out = append(out, h)
			}
		}
	}
	return out
}

func (w *randomWorld) someEvents() []Change {
	var ev []Change
	for _, h := range w.someHashes() {
		ev = append(ev, Change{Hash: h, Added: w.rng.IntN(3) > 0})
		if w.rng.IntN(8) == 0 { // add then remove (or the reverse) in one delta
			ev = append(ev, Change{Hash: h, Added: !ev[len(ev)-1].Added})
		}
	}
	return ev
}

func TestIndexMatchesReference(t *testing.T) {
	for seed := uint64(1); seed <= 8; seed++ {
		w := newRandomWorld(seed, 60, 5+int(seed)*9)
		max := 1 << 20
		if seed%2 == 0 {
			max = 150 // exercise refusals
		}
		x, r := NewIndex(IndexConfig{MaxPairs: max}), newRefIndex(max)
		queries := append([][]uint64{nil}, w.chains...)
		queryIDs := append(append([]string(nil), w.ids...), "ghost", w.ids[0])
		for step := 0; step < 300; step++ {
			id := w.ids[w.rng.IntN(len(w.ids))]
			var epoch, seq uint64 = 1, 0
			if n, ok := r.nodes[id]; ok {
				epoch, seq = n.epoch, n.seq
			}
			op := w.rng.IntN(20)
			switch {
			case op < 3:
				hs, e := w.someHashes(), epoch+uint64(w.rng.IntN(2)) // repair or restart
				x.ReplaceNode(id, e, seq, hs)
				r.replace(id, e, seq, hs)
			case op < 4:
				x.RemoveNode(id)
				r.removeNode(id)
			default:
				from := seq
				switch w.rng.IntN(10) {
				case 0:
					from = seq + 1 // gap
				case 1:
					from = seq - min(seq, 2) // overlap or duplicate
				}
				to := from + uint64(w.rng.IntN(4))
				e := epoch
				if w.rng.IntN(15) == 0 {
					e++
				}
				ev := w.someEvents()
				err, want := x.ApplyDelta(id, e, from, to, ev), r.apply(id, e, from, to, ev)
				if !sameErr(err, want) {
					t.Fatalf("seed %d step %d: ApplyDelta err %v, want %v", seed, step, err, want)
				}
			}
			if err := compareIndex(x, r, queries, queryIDs); err != nil {
				t.Fatalf("seed %d step %d: %v", seed, step, err)
			}
		}
	}
}

// TestIndexConcurrent: estimates from many goroutines while deltas, snapshots and removals run
// (meaningful under -race). Every estimate must be a consistent prefix count: 0..len(chain).
func TestIndexConcurrent(t *testing.T) {
	x := NewIndex(DefaultIndexConfig())
	o := NewOverlay(0, 0)
	chain := chainOf(1, 64)
	ids := []string{"a", "b", "c", "d"}
	for _, id := range ids {
		x.ReplaceNode(id, 1, 0, chain[:32])
	}
	done := make(chan struct{})
	errs := make(chan error, 4)
	for g := 0; g < 3; g++ {
		go func() {
			got := make([]int, len(ids))
			for {
				select {
				case <-done:
					errs <- nil
					return
				default:
				}
				x.Estimate(chain, ids, got)
				o.Estimate(chain, ids, got, t0)
				for _, m := range got {
					if m < 0 || m > len(chain) {
						errs <- fmt.Errorf("estimate %d", m)
						return
					}
				}
			}
		}()
	}
	for i := 0; i < 300; i++ {
		id := ids[i%len(ids)]
		_, seq, _, ok := x.NodeState(id)
		switch {
		case !ok || i%50 == 0:
			x.ReplaceNode(id, 1, 0, chain[:i%64])
		case i%77 == 0:
			x.RemoveNode(id)
		default:
			_ = x.ApplyDelta(id, 1, seq, seq+1, []Change{{chain[i%64], i%3 != 0}})
		}
		o.Record(id, chain[:i%64], t0)
		_ = x.Stats()
	}
	close(done)
	for g := 0; g < 3; g++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// The byte budget holds: adds that would grow a table past MaxBytes are refused and counted, the
// tables stay within it, and no estimate ever claims a block its node does not hold.
func TestIndexMaxBytes(t *testing.T) {
	const budget = 64 << 10
	x := NewIndex(IndexConfig{MaxPairs: 1 << 30, MaxBytes: budget})
	truth := map[string][]uint64{}
	for n := 0; n < 8; n++ {
		id := fmt.Sprintf("n%d", n)
		hs := make([]uint64, 4000)
		for i := range hs {
			hs[i] = uint64(n*1_000_000+i)*0x9E3779B97F4A7C15 | 1
		}
		hs[0], hs[1] = 7, 8 // a shared prefix
		truth[id] = hs
		x.ReplaceNode(id, 1, 1, hs)
	}
	st := x.Stats()
	if st.ApproxBytes-int64(len(x.nodes))*64 > budget || st.RefusedAdds == 0 {
		t.Fatalf("%+v: tables over the %d-byte budget, or nothing refused", st, budget)
	}
	ids := x.Nodes()
	got := make([]int, len(ids))
	for _, id := range ids {
		x.Estimate(truth[id], ids, got)
		for i, other := range ids {
			// A match may be short (refused adds), never longer than the node's real chain.
			real := 0
			for real < len(truth[id]) && real < len(truth[other]) && truth[id][real] == truth[other][real] {
				real++
			}
			if got[i] > real {
				t.Fatalf("estimate for %s's prompt on %s: %d blocks, it holds %d", id, other, got[i], real)
			}
		}
	}
	if err := (IndexConfig{MaxPairs: 1, MaxBytes: -1}).Validate(); err == nil {
		t.Fatal("accepted a negative MaxBytes")
	}
}
