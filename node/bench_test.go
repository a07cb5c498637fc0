package node

import (
	"context"
	"testing"

	"github.com/prefixmesh/prefixmesh/local"
	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
)

// The benchmarks measure the cost of the gRPC hop for an engine that delegates its prefix cache:
// an 8,192-token prompt in 16-token blocks (512 blocks), fully cached, peeked and looked up (then
// released) over a real loopback connection, next to the same call made in process on the same
// tree as the baseline. Run: go test -run '^$' -bench . -benchmem ./node/
const (
	benchTokens    = 8192
	benchBlockSize = 16
)

func benchNode(b *testing.B) (*testNode, []uint32) {
	n := startNode(b, local.Options{})
	p := prompt(1, benchTokens)
	must(n.client.Insert(context.Background(), &pb.InsertRequest{
		Tokens: p, BlockTable: blocks(1, benchTokens/benchBlockSize), BlockSize: benchBlockSize,
	}))(b)
	must(n.client.Release(context.Background(), &pb.ReleaseRequest{Tokens: p, BlockSize: benchBlockSize}))(b)
	return n, p
}

func BenchmarkPeek8k(b *testing.B) {
	n, p := benchNode(b)
	b.Run("inprocess", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if got := n.tree.PeekMatchedTokens(p, benchBlockSize, 0); got != benchTokens {
				b.Fatalf("peek = %d", got)
			}
		}
	})
	b.Run("grpc", func(b *testing.B) {
		ctx := context.Background()
		req := &pb.PeekMatchedTokensRequest{Tokens: p, BlockSize: benchBlockSize}
		b.ReportAllocs()
		for b.Loop() {
			r, err := n.client.PeekMatchedTokens(ctx, req)
			if err != nil || r.GetMatchedTokens() != benchTokens {
				b.Fatalf("peek = %v, %v", r, err)
			}
		}
	})
}

func BenchmarkLookupRelease8k(b *testing.B) {
	n, p := benchNode(b)
	b.Run("inprocess", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			m := n.tree.Lookup(p, benchBlockSize, 0, 0)
			if m.MatchedTokens != benchTokens {
				b.Fatalf("lookup = %d", m.MatchedTokens)
			}
			n.tree.ReleaseMatched(p, benchBlockSize, m.MatchedTokens, 0)
		}
	})
	b.Run("grpc", func(b *testing.B) {
		ctx := context.Background()
		req := &pb.LookupRequest{Tokens: p, BlockSize: benchBlockSize}
		b.ReportAllocs()
		for b.Loop() {
			r, err := n.client.Lookup(ctx, req)
			if err != nil || r.GetMatch().GetMatchedTokens() != benchTokens {
				b.Fatalf("lookup = %v, %v", r, err)
			}
			if _, err := n.client.ReleaseMatched(ctx, &pb.ReleaseMatchedRequest{
				Tokens: p, BlockSize: benchBlockSize, MatchedTokens: r.GetMatch().GetMatchedTokens(),
			}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
