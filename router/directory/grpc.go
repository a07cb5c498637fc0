package directory

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prefixmesh/prefixmesh/local"
	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
)

// GRPC is the Directory gRPC service: the HTTP endpoints' question and answer as protobuf.
// Admission and the listener's trust rule are the server's it is registered on.
type GRPC struct {
	pb.UnimplementedDirectoryServer
	d *Directory
}

// NewGRPC returns the gRPC codec over d.
func NewGRPC(d *Directory) *GRPC { return &GRPC{d: d} }

// Query implements pb.DirectoryServer.
func (g *GRPC) Query(_ context.Context, req *pb.DirectoryQueryRequest) (*pb.DirectoryQueryResponse, error) {
	q := &Query{Model: req.GetModel(), LoRA: req.GetLoraName(), BlockSize: int(req.GetBlockSize()), Instance: req.GetInstanceId()}
	if t := req.GetTokens(); len(t) > 0 {
		q.Tokens = t
	}
	if h := req.GetBlockHashes(); len(h) > 0 {
		q.Hashes = h
	}
	sc := scratchPool.Get().(*Scratch)
	defer scratchPool.Put(sc)
	matches, err := g.d.Lookup(q, sc)
	if err != nil {
		if errors.Is(err, ErrInvalid) {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		return nil, status.Error(codes.Internal, err.Error())
	}
	resp := &pb.DirectoryQueryResponse{Matches: make([]*pb.DirectoryMatch, len(matches))}
	for i, m := range matches {
		resp.Matches[i] = &pb.DirectoryMatch{Node: m.Node, LongestMatched: uint32(m.Longest),
			Gpu: uint32(m.Prefix[local.TierGPU]), Cpu: uint32(m.Prefix[local.TierCPU]), Disk: uint32(m.Prefix[local.TierDisk]),
			Storage: uint32(m.Prefix[local.TierStorage]), Remote: uint32(m.Prefix[local.TierRemote])}
	}
	return resp, nil
}
