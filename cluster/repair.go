package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
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

// fetchBackoff is the reconnect backoff of a repair connection. grpc-go's default grows to
// 120 s, which left a restarted node out of routing for up to 92 s in a restart test while the mirror
// itself retried every 5 s. These values equal DefaultConfig's RepairBackoff and
// MaxRepairBackoff, and a repair replaces a connection that is not connected or idle anyway, so
// the mirror's own schedule is what decides when a node is dialled again.
var fetchBackoff = backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 5 * time.Second}

// fetchConnectTimeout bounds one connection attempt: a node on a LAN answers in milliseconds,
// and a SYN lost to a frozen host must not hold a repair for grpc-go's default 20 s.
const fetchConnectTimeout = 2 * time.Second

// GRPCFetcher fetches summaries with NodeCache.GetSummary over one client connection per node
// member. The connections follow membership: the mirror calls Forget when a member leaves,
// restarts (new epoch) or changes address, and FetchSummary redials when the address it is
// given differs from the connection's. It is safe for concurrent use.
type GRPCFetcher struct {
	dialOpts []grpc.DialOption

	mu     sync.Mutex           // guards conns, closed
	conns  map[string]fetchConn // by node id
	closed bool
}

// fetchConn is a node's repair connection and the address it was dialled at.
type fetchConn struct {
	addr string
	cc   *grpc.ClientConn
}

// memberForgetter is implemented by fetchers that keep per-member state (GRPCFetcher's
// connections); the mirror tells them when a member's state is void.
type memberForgetter interface{ Forget(nodeID string) }

var _ memberForgetter = (*GRPCFetcher)(nil)

// NewGRPCFetcher returns a fetcher that dials with opts (plaintext when none are given) and the
// reconnect backoff above.
func NewGRPCFetcher(opts ...grpc.DialOption) *GRPCFetcher {
	if len(opts) == 0 {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	opts = append(slices.Clip(opts), grpc.WithConnectParams(grpc.ConnectParams{Backoff: fetchBackoff, MinConnectTimeout: fetchConnectTimeout}))
	return &GRPCFetcher{dialOpts: opts, conns: make(map[string]fetchConn)}
}

// conn returns node's connection, dialling it again if the address moved or the last attempt
// failed.
func (f *GRPCFetcher) conn(node Meta) (*grpc.ClientConn, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil, ErrClosed
	}
	if c, ok := f.conns[node.NodeID]; ok {
		// Only a connected or idle connection is reused. One in TRANSIENT_FAILURE stays there
		// (failing every RPC at once) until grpc-go's own reconnect schedule succeeds, and one
		// CONNECTING may be a retry that started before the node came back; the mirror backs
		// off between repairs on its own, so a fresh dial is what it wants.
		if st := c.cc.GetState(); c.addr == node.GRPCAddr && (st == connectivity.Ready || st == connectivity.Idle) {
			return c.cc, nil
		}
		_ = c.cc.Close()
		delete(f.conns, node.NodeID)
	}
	cc, err := grpc.NewClient(node.GRPCAddr, f.dialOpts...)
	if err != nil {
		return nil, err
	}
	f.conns[node.NodeID] = fetchConn{addr: node.GRPCAddr, cc: cc}
	return cc, nil
}

// Forget closes nodeID's connection, if any (a repair using it fails, and its result is
// discarded by the mirror, which has moved on).
func (f *GRPCFetcher) Forget(nodeID string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c, ok := f.conns[nodeID]; ok {
		_ = c.cc.Close()
		delete(f.conns, nodeID)
	}
}

// connAddrs returns node id → dialled address, for tests and debugging.
func (f *GRPCFetcher) connAddrs() map[string]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]string, len(f.conns))
	for id, c := range f.conns {
		out[id] = c.addr
	}
	return out
}

// FetchSummary streams node's full snapshot and checks that every chunk names the same node,
// epoch and sequence.
func (f *GRPCFetcher) FetchSummary(ctx context.Context, node Meta) (Summary, error) {
	if node.GRPCAddr == "" {
		return Summary{}, fmt.Errorf("fetch summary of %s: %w: no gRPC address", node.NodeID, ErrInvalid)
	}
	c, err := f.conn(node)
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

// Close closes every connection; later fetches fail with ErrClosed.
func (f *GRPCFetcher) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	var errs []error
	for id, c := range f.conns {
		errs = append(errs, c.cc.Close())
		delete(f.conns, id)
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
