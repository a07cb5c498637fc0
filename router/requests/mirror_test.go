package requests

import (
	"testing"
	"time"

	"github.com/prefixmesh/prefixmesh/cluster"
	"github.com/prefixmesh/prefixmesh/routing"
)

type fakeMirror []cluster.NodeStatus

func (f fakeMirror) Nodes() []cluster.NodeStatus { return f }

// MirrorNodes lists synced nodes with an engine URL, with their load and its age and the cold flag.
func TestMirrorNodes(t *testing.T) {
	now := time.Unix(100, 0)
	m := fakeMirror{
		{Meta: cluster.Meta{NodeID: "a", EngineURL: "http://a", Model: "m", BlockSize: 16, KVCapacity: 99, Cold: true},
			Load: cluster.Load{Running: 2, Waiting: 1, QueuedPrefillTokens: 300}, LoadRecv: now.Add(-time.Second), Synced: true},
		{Meta: cluster.Meta{NodeID: "b", EngineURL: "http://b"}, Synced: false},
		{Meta: cluster.Meta{NodeID: "c"}, Synced: true},
	}
	got := MirrorNodes{M: m, Now: func() time.Time { return now }}.Nodes()
	if len(got) != 1 {
		t.Fatalf("nodes %+v", got)
	}
	in := got[0].Info
	if got[0].EngineURL != "http://a" || in.ID != "a" || !in.Alive || in.Model != "m" || in.BlockSize != 16 ||
		in.Running != 2 || in.Waiting != 1 || in.QueuedPrefillTokens != 300 || in.CapacityBlocks != 99 || in.LoadAge != time.Second || !in.Cold {
		t.Fatalf("node %+v", got[0])
	}
	// A decision lists the same nodes into its scratch, leaving out those it may not use.
	src := MirrorNodes{M: m, Now: func() time.Time { return now }}
	infos, urls := src.AppendEligible(nil, nil, routing.Eligibility{Model: "m"})
	if len(infos) != 1 || infos[0] != in || len(urls) != 1 || urls[0] != "http://a" {
		t.Fatalf("eligible for m: %+v %v", infos, urls)
	}
	if infos, urls := src.AppendEligible(infos[:0], urls[:0], routing.Eligibility{Model: "other"}); len(infos) != 0 || len(urls) != 0 {
		t.Fatalf("eligible for another model: %+v %v", infos, urls)
	}
}
