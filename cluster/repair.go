package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
	"github.com/prefixmesh/prefixmesh/routing"
)

// Summary is a node's full summary at one sequence number.
type Summary struct {
	NodeID string
	Epoch  uint64
	Seq    uint64
	Hashes []uint64
}

// Fetcher pulls a node's full summary; the mirror calls it to repair.
type Fetcher interface {
	FetchSummary(ctx context.Context, node Meta) (Summary, error)
}

// errEpochMoved: a repair returned another epoch than the member's metadata says; the metadata
// is re-read and the repair retried.
var errEpochMoved = errors.New("summary epoch differs from member metadata")

// MaxSummaryHashes bounds a fetched summary: 64 Mi blocks (512 MiB of hashes) is beyond any
// node's KV capacity, and a node that claims more is refused rather than exhausting the router.
const MaxSummaryHashes = 1 << 26

// GRPCFetcher fetches summaries with NodeCache.GetSummary, keeping one client connection per
// node address. It is safe for concurrent use.
type GRPCFetcher struct {
	dialOpts []grpc.DialOption

	mu    sync.Mutex // guards conns
	conns map[string]*grpc.ClientConn
}

// NewGRPCFetcher returns a fetcher that dials with opts (plaintext when none are given).
func NewGRPCFetcher(opts ...grpc.DialOption) *GRPCFetcher {
	if len(opts) == 0 {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	return &GRPCFetcher{dialOpts: opts, conns: make(map[string]*grpc.ClientConn)}
}

func (f *GRPCFetcher) conn(addr string) (*grpc.ClientConn, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c := f.conns[addr]; c != nil {
		return c, nil
	}
	c, err := grpc.NewClient(addr, f.dialOpts...)
	if err != nil {
		return nil, err
	}
	f.conns[addr] = c
	return c, nil
}

// FetchSummary streams node's full snapshot and checks that every chunk names the same node,
// epoch and sequence.
func (f *GRPCFetcher) FetchSummary(ctx context.Context, node Meta) (Summary, error) {
	if node.GRPCAddr == "" {
		return Summary{}, fmt.Errorf("fetch summary of %s: %w: no gRPC address", node.NodeID, ErrInvalid)
	}
	c, err := f.conn(node.GRPCAddr)
	if err != nil {
		return Summary{}, fmt.Errorf("fetch summary of %s: %w", node.NodeID, err)
	}
	stream, err := pb.NewNodeCacheClient(c).GetSummary(ctx, &pb.GetSummaryRequest{})
	if err != nil {
		return Summary{}, fmt.Errorf("fetch summary of %s: %w", node.NodeID, err)
	}
	var s Summary
	for first := true; ; first = false {
		chunk, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return Summary{}, fmt.Errorf("fetch summary of %s: %w: stream ended before the last chunk", node.NodeID, ErrTruncated)
		}
		if err != nil {
			return Summary{}, fmt.Errorf("fetch summary of %s: %w", node.NodeID, err)
		}
		if chunk.GetKind() != pb.SummaryKind_SUMMARY_KIND_SNAPSHOT {
			return Summary{}, fmt.Errorf("fetch summary of %s: %w: chunk kind %v", node.NodeID, ErrInvalid, chunk.GetKind())
		}
		if first {
			s = Summary{NodeID: chunk.GetNodeId(), Epoch: chunk.GetEpoch(), Seq: chunk.GetSeq()}
			if s.NodeID != node.NodeID {
				return Summary{}, fmt.Errorf("fetch summary of %s: %w: %s answered", node.NodeID, ErrInvalid, s.NodeID)
			}
		} else if chunk.GetEpoch() != s.Epoch || chunk.GetSeq() != s.Seq {
			return Summary{}, fmt.Errorf("fetch summary of %s: %w: chunks of different versions", node.NodeID, ErrInvalid)
		}
		if len(s.Hashes)+len(chunk.GetHashes()) > MaxSummaryHashes {
			return Summary{}, fmt.Errorf("fetch summary of %s: %w: over %d hashes", node.NodeID, ErrTooLarge, MaxSummaryHashes)
		}
		s.Hashes = append(s.Hashes, chunk.GetHashes()...)
		if chunk.GetLast() {
			return s, nil
		}
	}
}

// Close closes every connection.
func (f *GRPCFetcher) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var errs []error
	for addr, c := range f.conns {
		errs = append(errs, c.Close())
		delete(f.conns, addr)
	}
	return errors.Join(errs...)
}

// errReason names an index error for the repairs metric.
func errReason(err error) string {
	switch {
	case errors.Is(err, routing.ErrGap):
		return "gap"
	case errors.Is(err, routing.ErrEpoch):
		return "epoch"
	case errors.Is(err, routing.ErrUnknownNode):
		return "unknown_node"
	default:
		return "error"
	}
}
