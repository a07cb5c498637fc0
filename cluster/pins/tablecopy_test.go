package pins

import (
	"context"
	"sync"
	"testing"
	"time"

	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
)

// TestTableCopyFeedsApplier: a node agent mirrors the table over Watch and its Applier pins the
// node's prefixes in the cache, then releases them when they are unpinned.
func TestTableCopyFeedsApplier(t *testing.T) {
	c, s := newSoloService(t)
	ctx := ctxT(t, 20*time.Second)
	mustWrite(t, s, putAdapter(1))
	toks := []uint32{10, 11, 12, 13}
	mustWrite(t, s, Command{Op: OpPinPrefix, AdapterID: 1, Tokens: toks, Nodes: []string{"gpu-1"}})

	m := NewTableCopy(c)
	cache := newFakeCache(2)
	cache.cached[fkey(toks, 1)] = 4
	ap := NewApplier(cache, 2)
	rctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = m.Run(rctx) }()
	go func() { defer wg.Done(); ap.Run(rctx, m, "gpu-1", 10*time.Millisecond) }()
	defer func() { stop(); wg.Wait() }()

	waitFor(t, 10*time.Second, "the applier to pin the mirrored prefix", func() bool {
		return ap.Held()[PrefixKey{1, PrefixHash(1, toks)}] == 4
	})
	if !m.Connected() {
		t.Fatal("table copy not connected")
	}
	// Changes flow: a placement pin shows up, the prefix unpin releases the holds.
	mustWrite(t, s, Command{Op: OpPinAdapter, AdapterID: 1, Nodes: []string{"gpu-1", "gpu-2"}})
	mustWrite(t, s, Command{Op: OpUnpinPrefix, AdapterID: 1, Tokens: toks})
	waitFor(t, 10*time.Second, "the unpin to release the holds", func() bool { return len(ap.Held()) == 0 })
	waitFor(t, 10*time.Second, "the table copy to catch up", func() bool { return m.AppliedIndex() == s.fsm.AppliedIndex() })
	if nodes, ok := m.AllowedNodes(1); !ok || len(nodes) != 2 {
		t.Fatalf("mirrored AllowedNodes = %v %v", nodes, ok)
	}
	if got, want := m.View(), s.View(); len(got.Adapters) != len(want.Adapters) || len(got.Prefixes) != 0 || len(got.Pins) != 1 {
		t.Fatalf("table copy %+v, store %+v", got, want)
	}
}

func TestTableCopyRefusesBadStream(t *testing.T) {
	if _, err := changeFromPB(&pb.PinChange{Kind: pb.PinChange_PIN_PREFIX, PrefixPin: &pb.PrefixPin{AdapterId: 1, PrefixHash: 1, Tokens: []uint32{1}, Nodes: []string{"a"}}}); err == nil {
		t.Fatal("accepted a prefix pin whose hash does not match its tokens")
	}
	if _, err := changeFromPB(&pb.PinChange{Kind: 99}); err == nil {
		t.Fatal("accepted an unknown change kind")
	}
}
