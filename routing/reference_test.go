package routing

import (
	"errors"
	"fmt"
	"sort"
)

// refIndex is the naive model of Index: per node, a set of hashes and (epoch, seq); the estimate
// walks each node's set separately. It applies the same MaxPairs rule (refuse an add when full).
type refIndex struct {
	max   int
	pairs int
	nodes map[string]*refNode
}

type refNode struct {
	epoch, seq uint64
	set        map[uint64]bool
	refused    uint64
}

func newRefIndex(max int) *refIndex { return &refIndex{max: max, nodes: map[string]*refNode{}} }

func (r *refIndex) add(n *refNode, h uint64) {
	if n.set[h] {
		return
	}
	if r.pairs >= r.max {
		n.refused++
		return
	}
	n.set[h] = true
	r.pairs++
}

func (r *refIndex) remove(n *refNode, h uint64) {
	if n.set[h] {
		delete(n.set, h)
		r.pairs--
	}
}

func (r *refIndex) replace(id string, epoch, seq uint64, hashes []uint64) {
	r.removeNode(id)
	n := &refNode{epoch: epoch, seq: seq, set: map[uint64]bool{}}
	r.nodes[id] = n
	for _, h := range hashes {
		r.add(n, h)
	}
}

func (r *refIndex) removeNode(id string) {
	if n, ok := r.nodes[id]; ok {
		r.pairs -= len(n.set)
		delete(r.nodes, id)
	}
}

func (r *refIndex) apply(id string, epoch, from, to uint64, ev []Change) error {
	if to < from {
		return ErrInvalid
	}
	n, ok := r.nodes[id]
	switch {
	case !ok:
		return ErrUnknownNode
	case n.epoch != epoch:
		return ErrEpoch
	case to <= n.seq:
		return nil
	case from > n.seq:
		return ErrGap
	}
	for _, e := range ev {
		if e.Added {
			r.add(n, e.Hash)
		} else {
			r.remove(n, e.Hash)
		}
	}
	n.seq = to
	return nil
}

func (r *refIndex) estimate(hashes []uint64, id string) int {
	n, ok := r.nodes[id]
	if !ok {
		return 0
	}
	k := 0
	for k < len(hashes) && n.set[hashes[k]] {
		k++
	}
	return k
}

// compareIndex checks every observable of x against r for the given queries.
func compareIndex(x *Index, r *refIndex, queries [][]uint64, ids []string) error {
	st := x.Stats()
	if st.Pairs != r.pairs || st.Nodes != len(r.nodes) {
		return fmt.Errorf("stats: pairs %d nodes %d, want %d %d", st.Pairs, st.Nodes, r.pairs, len(r.nodes))
	}
	var want []string
	for id := range r.nodes {
		want = append(want, id)
	}
	sort.Strings(want)
	if got := x.Nodes(); fmt.Sprint(got) != fmt.Sprint(want) {
		return fmt.Errorf("nodes %v, want %v", got, want)
	}
	for _, id := range ids {
		e, s, b, ok := x.NodeState(id)
		n, rok := r.nodes[id]
		if ok != rok || (ok && (e != n.epoch || s != n.seq || b != len(n.set))) {
			return fmt.Errorf("node %s state (%d %d %d %v), want %+v", id, e, s, b, ok, n)
		}
	}
	got := make([]int, len(ids))
	for _, q := range queries {
		x.Estimate(q, ids, got)
		for i, id := range ids {
			if w := r.estimate(q, id); got[i] != w {
				return fmt.Errorf("estimate node %s chain len %d: %d, want %d", id, len(q), got[i], w)
			}
		}
	}
	return nil
}

// sameErr reports whether err and want are the same sentinel (or both nil).
func sameErr(err, want error) bool {
	if want == nil {
		return err == nil
	}
	return errors.Is(err, want)
}
