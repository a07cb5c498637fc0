package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prefixmesh/prefixmesh/local"
	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
)

// Tree is what the server needs from the node's cache: the PrefixCache contract plus the
// counters and the summary journal that local.RadixTree keeps (local/CONTRACT.md).
type Tree interface {
	local.PrefixCache
	HitStats() local.HitStats
	SnapshotStats() local.SnapshotStats
	SummarySince(since uint64, dst []local.SummaryEvent) ([]local.SummaryEvent, uint64, bool)
	SummarySnapshot(dst []uint64) ([]uint64, uint64)
	SummaryHead() uint64
}

var _ Tree = (*local.RadixTree)(nil)

// Config configures a Server. The zero value is not valid: Cache is required.
type Config struct {
	// NodeID names the node in summaries and stats (the daemon's --node-id).
	NodeID string
	// BlockSize is the node's configured block size, advertised in summary chunks so a router
	// hashes prompts the way this node's engine inserts them. 0 means unknown.
	BlockSize int
	// Epoch identifies this incarnation of the cache; 0 picks a random non-zero value. Tests set
	// it to get reproducible output.
	Epoch uint64
	// Logger receives structured logs; nil discards them.
	Logger *slog.Logger
	// Registry receives the server's Prometheus metrics; nil means no metrics.
	Registry *prometheus.Registry
	// ReadOnly serves only the calls that change nothing (IsActive, PeekMatchedTokens,
	// SnapshotCount, Stats, GetSummary) and answers FailedPrecondition to the others. Set it when
	// an in-process engine (--engine=sim) owns the tree: its KV pool applies the references its
	// own calls return, and a remote Insert, Evict or Release would break that accounting.
	ReadOnly bool
	// Owner names what owns a read-only server's tree, in the error a refused call gets (for
	// example "the vLLM engine beside this agent, mirrored from its KV events"). Empty: "the
	// in-process engine".
	Owner string
}

// Server implements the NodeCache gRPC service over one node's Tree. It is safe for concurrent
// use; all state lives in the tree and in atomics.
type Server struct {
	pb.UnimplementedNodeCacheServer

	tree      Tree
	nodeID    string
	blockSize int32
	epoch     atomic.Uint64 // NewEpoch moves it when the cache is replaced by an empty one
	readOnly  bool
	owner     string // who owns a read-only tree, for ErrReadOnly's message
	log       *slog.Logger
	metrics   *metrics // nil when Config.Registry is nil
}

// ErrReadOnly is returned (as FailedPrecondition, its message naming Config.Owner) by calls that
// change the cache when the server is read-only.
var ErrReadOnly = errors.New("only read-only NodeCache calls are served")

var _ pb.NodeCacheServer = (*Server)(nil)

// New returns a Server over tree. It registers its metrics on cfg.Registry (if any) and fails if
// they are already registered there.
func New(tree Tree, cfg Config) (*Server, error) {
	if tree == nil {
		return nil, errors.New("node: nil tree")
	}
	if cfg.BlockSize < 0 || cfg.BlockSize > MaxBlockSize {
		return nil, fmt.Errorf("node: block size %d out of [0, %d]", cfg.BlockSize, MaxBlockSize)
	}
	epoch := cfg.Epoch
	for epoch == 0 {
		epoch = rand.Uint64()
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		tree:      tree,
		nodeID:    cfg.NodeID,
		blockSize: int32(cfg.BlockSize),
		readOnly:  cfg.ReadOnly,
		owner:     cmp.Or(cfg.Owner, "the in-process engine"),
		log:       log,
	}
	s.epoch.Store(epoch)
	if cfg.Registry != nil {
		m, err := newMetrics(cfg.Registry, tree)
		if err != nil {
			return nil, fmt.Errorf("node: register metrics: %w", err)
		}
		s.metrics = m
	}
	return s, nil
}

// Epoch is this incarnation's random identifier; a router that sees it change drops everything
// it knew about the node (docs/architecture.md, "One cache change").
func (s *Server) Epoch() uint64 { return s.epoch.Load() }

// NewEpoch moves the server to a fresh random epoch (non-zero, not the current one) and returns
// it. Call it after the tree was replaced by an empty one (a mirrored engine restarted), never
// before: a router that repairs with GetSummary and sees the new epoch must find none of the old
// cache's blocks. Gossip the same epoch (cluster.Agent.SetEpoch) so that routers expect it.
func (s *Server) NewEpoch() uint64 {
	old := s.epoch.Load()
	e := old
	for e == 0 || e == old {
		e = rand.Uint64()
	}
	s.epoch.Store(e)
	return e
}

// NodeID is the node's configured id.
func (s *Server) NodeID() string { return s.nodeID }

// Register adds the NodeCache service to g.
func (s *Server) Register(g *grpc.Server) { pb.RegisterNodeCacheServer(g, s) }

// ServerOptions are the grpc.Server options the NodeCache service needs: message limits derived
// from MaxTokens and the server's interceptors (metrics, logging, panic recovery).
func (s *Server) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(MaxMsgSize),
		grpc.MaxSendMsgSize(MaxMsgSize),
		grpc.ChainUnaryInterceptor(s.unaryInterceptor),
		grpc.ChainStreamInterceptor(s.streamInterceptor),
	}
}

// admit validates req and, for a call that changes the cache, checks that the server is writable.
// It returns the gRPC status the client sees.
func (s *Server) admit(req any, mutates bool) error {
	if mutates && s.readOnly {
		return status.Error(codes.FailedPrecondition, fmt.Sprintf("the prefix cache is owned by %s; %v", s.owner, ErrReadOnly))
	}
	if err := Validate(req); err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	return nil
}

// IsActive implements NodeCache.IsActive.
func (s *Server) IsActive(context.Context, *pb.IsActiveRequest) (*pb.IsActiveResponse, error) {
	return &pb.IsActiveResponse{Active: s.tree.IsActive()}, nil
}

// Lookup implements NodeCache.Lookup.
func (s *Server) Lookup(_ context.Context, req *pb.LookupRequest) (*pb.LookupResponse, error) {
	if err := s.admit(req, true); err != nil {
		return nil, err
	}
	m := s.tree.Lookup(req.GetTokens(), int(req.GetBlockSize()), req.GetSessionHash(), req.GetAdapterId())
	return &pb.LookupResponse{Match: matchToProto(m)}, nil
}

// PeekMatchedTokens implements NodeCache.PeekMatchedTokens. A request without block_size is
// read with the node's own (Config.BlockSize, the size its summaries advertise), so a caller
// need not know it; it is refused only when the node's is unknown too.
func (s *Server) PeekMatchedTokens(_ context.Context, req *pb.PeekMatchedTokensRequest) (*pb.PeekMatchedTokensResponse, error) {
	if req != nil && req.GetBlockSize() == 0 && s.blockSize > 0 {
		req.BlockSize = s.blockSize
	}
	if err := s.admit(req, false); err != nil {
		return nil, err
	}
	n := s.tree.PeekMatchedTokens(req.GetTokens(), int(req.GetBlockSize()), req.GetAdapterId())
	return &pb.PeekMatchedTokensResponse{MatchedTokens: int64(n)}, nil
}

// PinPrefix implements NodeCache.PinPrefix.
func (s *Server) PinPrefix(_ context.Context, req *pb.PinPrefixRequest) (*pb.PinPrefixResponse, error) {
	if err := s.admit(req, true); err != nil {
		return nil, err
	}
	n := s.tree.PinPrefix(req.GetTokens(), int(req.GetBlockSize()), req.GetAdapterId())
	return &pb.PinPrefixResponse{MatchedTokens: int64(n)}, nil
}

// Insert implements NodeCache.Insert.
func (s *Server) Insert(_ context.Context, req *pb.InsertRequest) (*pb.InsertResponse, error) {
	if err := s.admit(req, true); err != nil {
		return nil, err
	}
	acq := s.tree.Insert(req.GetTokens(), req.GetBlockTable(), req.GetDiskBlockIds(),
		int(req.GetBlockSize()), int(req.GetMatchedTokens()), req.GetAdapterId())
	return &pb.InsertResponse{Acquired: acquiredToProto(acq)}, nil
}

// InsertWithSnapshot implements NodeCache.InsertWithSnapshot.
func (s *Server) InsertWithSnapshot(_ context.Context, req *pb.InsertWithSnapshotRequest) (*pb.InsertWithSnapshotResponse, error) {
	if err := s.admit(req, true); err != nil {
		return nil, err
	}
	displaced, ok, acq := s.tree.InsertWithSnapshot(req.GetTokens(), req.GetBlockTable(), req.GetDiskBlockIds(),
		int(req.GetBlockSize()), int(req.GetSnapshotId()), req.GetSessionHash(), int(req.GetMatchedTokens()), req.GetAdapterId())
	return &pb.InsertWithSnapshotResponse{HasDisplaced: ok, Displaced: int64(displaced), Acquired: acquiredToProto(acq)}, nil
}

// InsertIntermediateSnapshot implements NodeCache.InsertIntermediateSnapshot.
func (s *Server) InsertIntermediateSnapshot(_ context.Context, req *pb.InsertIntermediateSnapshotRequest) (*pb.InsertIntermediateSnapshotResponse, error) {
	if err := s.admit(req, true); err != nil {
		return nil, err
	}
	displaced, ok := s.tree.InsertIntermediateSnapshot(req.GetTokens(), req.GetBlockTable(), req.GetDiskBlockIds(),
		int(req.GetBlockSize()), int(req.GetSnapshotId()), req.GetSessionHash(), int(req.GetMatchedTokens()), req.GetAdapterId())
	return &pb.InsertIntermediateSnapshotResponse{HasDisplaced: ok, Displaced: int64(displaced)}, nil
}

// InsertTailSnapshot implements NodeCache.InsertTailSnapshot.
func (s *Server) InsertTailSnapshot(_ context.Context, req *pb.InsertTailSnapshotRequest) (*pb.InsertTailSnapshotResponse, error) {
	if err := s.admit(req, true); err != nil {
		return nil, err
	}
	slots := s.tree.InsertTailSnapshot(req.GetTokens(), int(req.GetSnapshotId()), req.GetSessionHash(), req.GetAdapterId())
	out := make([]int64, len(slots))
	for i, v := range slots {
		out[i] = int64(v)
	}
	return &pb.InsertTailSnapshotResponse{Displaced: out}, nil
}

// InsertTailSiblingSnapshot implements NodeCache.InsertTailSiblingSnapshot.
func (s *Server) InsertTailSiblingSnapshot(_ context.Context, req *pb.InsertTailSiblingSnapshotRequest) (*pb.InsertTailSiblingSnapshotResponse, error) {
	if err := s.admit(req, true); err != nil {
		return nil, err
	}
	displaced, ok := s.tree.InsertTailSiblingSnapshot(req.GetTokens(), int(req.GetSnapshotId()), req.GetSessionHash(), req.GetAdapterId())
	return &pb.InsertTailSiblingSnapshotResponse{HasDisplaced: ok, Displaced: int64(displaced)}, nil
}

// Release implements NodeCache.Release.
func (s *Server) Release(_ context.Context, req *pb.ReleaseRequest) (*pb.ReleaseResponse, error) {
	if err := s.admit(req, true); err != nil {
		return nil, err
	}
	s.tree.Release(req.GetTokens(), int(req.GetBlockSize()), req.GetAdapterId())
	return &pb.ReleaseResponse{}, nil
}

// ReleaseMatched implements NodeCache.ReleaseMatched.
func (s *Server) ReleaseMatched(_ context.Context, req *pb.ReleaseMatchedRequest) (*pb.ReleaseMatchedResponse, error) {
	if err := s.admit(req, true); err != nil {
		return nil, err
	}
	s.tree.ReleaseMatched(req.GetTokens(), int(req.GetBlockSize()), int(req.GetMatchedTokens()), req.GetAdapterId())
	return &pb.ReleaseMatchedResponse{}, nil
}

// Evict implements NodeCache.Evict.
func (s *Server) Evict(_ context.Context, req *pb.EvictRequest) (*pb.EvictResponse, error) {
	if err := s.admit(req, true); err != nil {
		return nil, err
	}
	ev := s.tree.Evict(int(req.GetNumBlocks()))
	if s.metrics != nil {
		s.metrics.evictedBlocks.Add(float64(ev.Len()))
	}
	return &pb.EvictResponse{Physical: ev.Physical, DiskBlockIds: ev.DiskBlockIDs}, nil
}

// EvictSnapshotLRU implements NodeCache.EvictSnapshotLRU.
func (s *Server) EvictSnapshotLRU(_ context.Context, req *pb.EvictSnapshotLRURequest) (*pb.EvictSnapshotLRUResponse, error) {
	if err := s.admit(req, true); err != nil {
		return nil, err
	}
	slot, ok := s.tree.EvictSnapshotLRU()
	return &pb.EvictSnapshotLRUResponse{HasSlot: ok, Slot: int64(slot)}, nil
}

// EvictSnapshotSlot implements NodeCache.EvictSnapshotSlot.
func (s *Server) EvictSnapshotSlot(_ context.Context, req *pb.EvictSnapshotSlotRequest) (*pb.EvictSnapshotSlotResponse, error) {
	if err := s.admit(req, true); err != nil {
		return nil, err
	}
	return &pb.EvictSnapshotSlotResponse{Evicted: s.tree.EvictSnapshotSlot(int(req.GetSlot()))}, nil
}

// EvictSnapshotToTier implements NodeCache.EvictSnapshotToTier.
func (s *Server) EvictSnapshotToTier(_ context.Context, req *pb.EvictSnapshotToTierRequest) (*pb.EvictSnapshotToTierResponse, error) {
	if err := s.admit(req, true); err != nil {
		return nil, err
	}
	te, ok := s.tree.EvictSnapshotToTier(int(req.GetMinTokens()))
	if !ok {
		return &pb.EvictSnapshotToTierResponse{}, nil
	}
	return &pb.EvictSnapshotToTierResponse{HasTierEvict: true, TierEvict: &pb.TierEvict{
		Spill: te.Spill, Slot: int64(te.Slot), Key: te.Key, Depth: int64(te.Depth),
	}}, nil
}

// PromoteSnapshot implements NodeCache.PromoteSnapshot.
func (s *Server) PromoteSnapshot(_ context.Context, req *pb.PromoteSnapshotRequest) (*pb.PromoteSnapshotResponse, error) {
	if err := s.admit(req, true); err != nil {
		return nil, err
	}
	return &pb.PromoteSnapshotResponse{Promoted: s.tree.PromoteSnapshot(req.GetKey(), int(req.GetNewSlot()))}, nil
}

// ForgetSnapshotTierKey implements NodeCache.ForgetSnapshotTierKey.
func (s *Server) ForgetSnapshotTierKey(_ context.Context, req *pb.ForgetSnapshotTierKeyRequest) (*pb.ForgetSnapshotTierKeyResponse, error) {
	if err := s.admit(req, true); err != nil {
		return nil, err
	}
	return &pb.ForgetSnapshotTierKeyResponse{Forgotten: s.tree.ForgetSnapshotTierKey(req.GetKey())}, nil
}

// SnapshotCount implements NodeCache.SnapshotCount.
func (s *Server) SnapshotCount(context.Context, *pb.SnapshotCountRequest) (*pb.SnapshotCountResponse, error) {
	return &pb.SnapshotCountResponse{Count: int64(s.tree.SnapshotCount())}, nil
}

// Stats implements NodeCache.Stats.
func (s *Server) Stats(context.Context, *pb.StatsRequest) (*pb.StatsResponse, error) {
	entries, blocks := s.tree.Stats()
	hs := s.tree.HitStats()
	ss := s.tree.SnapshotStats()
	return &pb.StatsResponse{
		NodeId:        s.nodeID,
		Epoch:         s.epoch.Load(),
		Entries:       int64(entries),
		CachedBlocks:  int64(blocks),
		Hits:          hs.Hits,
		Misses:        hs.Misses,
		HitTokens:     hs.HitTokens,
		SnapshotCount: int64(s.tree.SnapshotCount()),
		Snapshot: &pb.SnapshotStats{
			Saves:                 ss.Saves,
			Lookups:               ss.Lookups,
			Hits:                  ss.Hits,
			AnchorDepthSum:        ss.AnchorDepthSum,
			RecomputeTokensOnHit:  ss.RecomputeTokensOnHit,
			RecomputeTokensOnMiss: ss.RecomputeTokensOnMiss,
			Evictions:             ss.Evictions,
			TierSpills:            ss.TierSpills,
			TierHits:              ss.TierHits,
			TierFaultIns:          ss.TierFaultIns,
			TierReaps:             ss.TierReaps,
		},
		SummarySeq: s.tree.SummaryHead(),
	}, nil
}

func matchToProto(m local.PrefixMatch) *pb.PrefixMatch {
	return &pb.PrefixMatch{
		MatchedBlocks:         m.MatchedBlocks,
		MatchedDiskBlockIds:   m.MatchedDiskBlockIDs,
		MatchedTokens:         int64(m.MatchedTokens),
		HasSsmSnapshot:        m.HasSSMSnapshot,
		SsmSnapshot:           int64(m.SSMSnapshot),
		SsmSnapshotTokens:     int64(m.SSMSnapshotTokens),
		HasSsmSnapshotTier:    m.HasSSMSnapshotTier,
		SsmSnapshotTierKey:    m.SSMSnapshotTierKey,
		SsmSnapshotTierTokens: int64(m.SSMSnapshotTierToks),
		SsmSnapshotIsTail:     m.SSMSnapshotIsTail,
	}
}

func acquiredToProto(a local.InsertAcquired) *pb.InsertAcquired {
	return &pb.InsertAcquired{
		DiskBlockIds:         a.DiskBlockIDs,
		Blocks:               a.Blocks,
		ReleasedBlocks:       a.ReleasedBlocks,
		ReleasedDiskBlockIds: a.ReleasedDiskBlockIDs,
	}
}
