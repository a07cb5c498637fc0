package router

import (
	"context"
	"fmt"
	"testing"

	"github.com/prefixmesh/prefixmesh/local"
	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
	"github.com/prefixmesh/prefixmesh/routing"
)

// BenchmarkRoute is one Route call (no gRPC transport) for an 8k-token prompt over 64 synced
// nodes, one of which caches half of it; the baseline is hashing the prompt alone.
func BenchmarkRoute(b *testing.B) {
	idx := routing.NewIndex(routing.DefaultIndexConfig())
	p := seq(8192, 1)
	var mirror fakeMirror
	for i := 0; i < 64; i++ {
		id := fmt.Sprintf("node-%d", i)
		mirror = append(mirror, node(id, 16, true, uint32(i%4)))
		var hashes []uint64
		if i == 17 {
			hashes = local.BlockHashes(p[:4096], 16, 0)
		}
		idx.ReplaceNode(id, 1, 1, hashes)
	}
	srv, err := NewServer(NewView(mirror, idx), DefaultConfig(), nil)
	if err != nil {
		b.Fatal(err)
	}
	req := &pb.RouteRequest{Tokens: p}
	b.Run("route", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			resp, err := srv.Route(context.Background(), req)
			if err != nil || resp.NodeId != "node-17" {
				b.Fatal(err, resp.GetNodeId())
			}
		}
	})
	b.Run("hash-only", func(b *testing.B) {
		var h []uint64
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			h = local.AppendBlockHashes(h[:0], p, 16, 0)
		}
	})
}
