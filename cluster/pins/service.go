package pins

import (
	"context"
	"errors"
	"strconv"
	"time"

	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TokenizeFunc turns a text prompt into token ids (the router's configured tokenizer).
type TokenizeFunc func(text string) ([]uint32, error)

// Service serves the Pins gRPC API (and PinsPeer, for forwarding) over a Store.
type Service struct {
	pb.UnimplementedPinsServer
	store    *Store
	tokenize TokenizeFunc // nil: text prefixes are refused
}

var _ pb.PinsServer = (*Service)(nil)

// NewService returns the gRPC face of store. tokenize may be nil.
func NewService(store *Store, tokenize TokenizeFunc) *Service {
	return &Service{store: store, tokenize: tokenize}
}

// Register registers Pins and PinsPeer on g.
func (s *Service) Register(g *grpc.Server) {
	pb.RegisterPinsServer(g, s)
	pb.RegisterPinsPeerServer(g, peerServer{s: s.store})
}

// toStatus maps the package's errors to gRPC status errors; only this edge knows codes.
func toStatus(err error) error {
	var ve *VersionError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ve):
		st := status.New(codes.FailedPrecondition, err.Error())
		if d, derr := st.WithDetails(&errdetails.ErrorInfo{Reason: "PINS_VERSION_MISMATCH", Domain: errorDomain,
			Metadata: map[string]string{"current_version": strconv.FormatUint(ve.Current, 10)}}); derr == nil {
			st = d
		}
		return st.Err()
	case errors.Is(err, ErrInvalid):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, ErrNotFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, ErrLimit):
		return status.Error(codes.ResourceExhausted, err.Error())
	case errors.Is(err, ErrUnavailable), errors.Is(err, ErrNotLeader), errors.Is(err, ErrClosed):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

func cond(v *uint64) Cond {
	if v == nil {
		return Cond{}
	}
	return IfVersion(*v)
}

func (s *Service) write(ctx context.Context, c Command) (Result, error) {
	r, err := s.store.Write(ctx, c)
	return r, toStatus(err)
}

// PutAdapter implements pb.PinsServer.
func (s *Service) PutAdapter(ctx context.Context, req *pb.PutAdapterRequest) (*pb.PutAdapterResponse, error) {
	a := req.GetAdapter()
	if a == nil {
		return nil, status.Error(codes.InvalidArgument, "adapter is required")
	}
	ad := Adapter{ID: a.GetId(), Name: a.GetName(), BaseModel: a.GetBaseModel(), Revision: a.GetRevision()}
	r, err := s.write(ctx, Command{Op: OpPutAdapter, Adapter: ad, Cond: cond(req.ExpectedVersion)})
	if err != nil {
		return nil, err
	}
	ad.Version = r.Version
	return &pb.PutAdapterResponse{Adapter: adapterPB(ad), AppliedIndex: r.Index}, nil
}

// DeleteAdapter implements pb.PinsServer.
func (s *Service) DeleteAdapter(ctx context.Context, req *pb.DeleteAdapterRequest) (*pb.DeleteAdapterResponse, error) {
	r, err := s.write(ctx, Command{Op: OpDeleteAdapter, AdapterID: req.GetId(), Cond: cond(req.ExpectedVersion)})
	if err != nil {
		return nil, err
	}
	return &pb.DeleteAdapterResponse{AppliedIndex: r.Index}, nil
}

// PinAdapter implements pb.PinsServer.
func (s *Service) PinAdapter(ctx context.Context, req *pb.PinAdapterRequest) (*pb.PinAdapterResponse, error) {
	c := Command{Op: OpPinAdapter, AdapterID: req.GetAdapterId(), Nodes: req.GetNodes(), Cond: cond(req.ExpectedVersion)}
	r, err := s.write(ctx, c)
	if err != nil {
		return nil, err
	}
	p := AdapterPin{AdapterID: c.AdapterID, Nodes: normalizeNodes(c.Nodes), Version: r.Version}
	return &pb.PinAdapterResponse{Pin: pinPB(p), AppliedIndex: r.Index}, nil
}

// UnpinAdapter implements pb.PinsServer.
func (s *Service) UnpinAdapter(ctx context.Context, req *pb.UnpinAdapterRequest) (*pb.UnpinAdapterResponse, error) {
	r, err := s.write(ctx, Command{Op: OpUnpinAdapter, AdapterID: req.GetAdapterId(), Cond: cond(req.ExpectedVersion)})
	if err != nil {
		return nil, err
	}
	return &pb.UnpinAdapterResponse{AppliedIndex: r.Index}, nil
}

// prefixTokens resolves the tokens-or-text of a prefix request.
func (s *Service) prefixTokens(tokens []uint32, text string) ([]uint32, error) {
	switch {
	case len(tokens) > 0 && text != "":
		return nil, status.Error(codes.InvalidArgument, "give tokens or text, not both")
	case text == "":
		return tokens, nil
	case s.tokenize == nil:
		return nil, status.Error(codes.InvalidArgument, "text prefixes need a tokenizer on this router; send tokens")
	}
	if len(text) > MaxPrefixTokens*16 {
		return nil, status.Errorf(codes.InvalidArgument, "text of %d bytes is over the limit of %d", len(text), MaxPrefixTokens*16)
	}
	toks, err := s.tokenize(text)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "tokenize text: %v", err)
	}
	return toks, nil
}

// PinPrefix implements pb.PinsServer.
func (s *Service) PinPrefix(ctx context.Context, req *pb.SetPrefixPinRequest) (*pb.SetPrefixPinResponse, error) {
	toks, err := s.prefixTokens(req.GetTokens(), req.GetText())
	if err != nil {
		return nil, err
	}
	c := Command{Op: OpPinPrefix, AdapterID: req.GetAdapterId(), Tokens: toks, Nodes: req.GetNodes(), Cond: cond(req.ExpectedVersion)}
	r, err := s.write(ctx, c)
	if err != nil {
		return nil, err
	}
	p := PrefixPin{AdapterID: c.AdapterID, Hash: PrefixHash(c.AdapterID, toks), Tokens: toks, Nodes: normalizeNodes(c.Nodes), Version: r.Version}
	return &pb.SetPrefixPinResponse{Pin: prefixPB(p), AppliedIndex: r.Index}, nil
}

// UnpinPrefix implements pb.PinsServer.
func (s *Service) UnpinPrefix(ctx context.Context, req *pb.ClearPrefixPinRequest) (*pb.ClearPrefixPinResponse, error) {
	toks, err := s.prefixTokens(req.GetTokens(), req.GetText())
	if err != nil {
		return nil, err
	}
	if len(toks) > 0 && req.GetPrefixHash() != 0 {
		return nil, status.Error(codes.InvalidArgument, "give tokens, text or prefix_hash, not several")
	}
	if len(toks) == 0 && req.GetPrefixHash() == 0 {
		return nil, status.Error(codes.InvalidArgument, "tokens, text or prefix_hash is required")
	}
	c := Command{Op: OpUnpinPrefix, AdapterID: req.GetAdapterId(), Tokens: toks, PrefixHash: req.GetPrefixHash(), Cond: cond(req.ExpectedVersion)}
	r, err := s.write(ctx, c)
	if err != nil {
		return nil, err
	}
	return &pb.ClearPrefixPinResponse{AppliedIndex: r.Index}, nil
}

// List implements pb.PinsServer.
func (s *Service) List(ctx context.Context, req *pb.ListPinsRequest) (*pb.ListPinsResponse, error) {
	if req.GetLinearizable() {
		if err := s.store.Sync(ctx); err != nil {
			return nil, toStatus(err)
		}
	}
	return s.listResponse(s.store.View()), nil
}

// Members implements pb.PinsServer: this member's view of the Raft configuration.
func (s *Service) Members(context.Context, *pb.PinsMembersRequest) (*pb.PinsMembersResponse, error) {
	m, err := s.store.Membership()
	if err != nil {
		return nil, toStatus(err)
	}
	out := &pb.PinsMembersResponse{LeaderId: m.LeaderID, ServerId: m.Self, State: m.State, Term: m.Term,
		LastContactSeconds: -1, StalenessSeconds: m.Staleness.Seconds(), AppliedIndex: m.Applied}
	switch {
	case m.LeaderID == m.Self:
		out.LastContactSeconds = 0
	case !m.LastContact.IsZero():
		out.LastContactSeconds = time.Since(m.LastContact).Seconds()
	}
	for _, srv := range m.Servers {
		out.Servers = append(out.Servers, &pb.PinsRaftServer{Id: srv.ID, RaftAddress: srv.RaftAddr, GrpcAddress: srv.GRPCAddr,
			Voter: srv.Voter, Leader: srv.ID == m.LeaderID})
	}
	return out, nil
}

func (s *Service) listResponse(v View) *pb.ListPinsResponse {
	leader, _ := s.store.Leader()
	out := &pb.ListPinsResponse{
		AppliedIndex:     v.AppliedIndex,
		StalenessSeconds: s.store.Staleness().Seconds(),
		LeaderId:         leader,
		ServerId:         s.store.ID(),
	}
	for _, a := range v.Adapters {
		out.Adapters = append(out.Adapters, adapterPB(a))
	}
	for _, p := range v.Pins {
		out.Pins = append(out.Pins, pinPB(p))
	}
	for _, p := range v.Prefixes {
		out.PrefixPins = append(out.PrefixPins, prefixPB(p))
	}
	return out
}

// watchBatch bounds the changes of one Watch event, keeping events far below gRPC's 4 MiB limit
// even when every change is a maximal prefix pin (≤ 160 KiB each).
const watchBatch = 16

// Watch implements pb.PinsServer: the table, then changes; a fresh table whenever the journal
// no longer covers what the stream missed.
func (s *Service) Watch(_ *pb.WatchPinsRequest, stream grpc.ServerStreamingServer[pb.PinsWatchEvent]) error {
	ctx := stream.Context()
	ch, stop := s.store.Subscribe()
	defer stop()
	fsm := s.store.FSM()
	v := fsm.View()
	if err := stream.Send(&pb.PinsWatchEvent{Reset_: true, State: s.listResponse(v), AppliedIndex: v.AppliedIndex}); err != nil {
		return err
	}
	last := v.AppliedIndex
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ch:
		}
		changes, applied, ok := fsm.ChangesSince(last)
		if !ok {
			v := fsm.View()
			if err := stream.Send(&pb.PinsWatchEvent{Reset_: true, State: s.listResponse(v), AppliedIndex: v.AppliedIndex}); err != nil {
				return err
			}
			last = v.AppliedIndex
			continue
		}
		for len(changes) > 0 {
			n := min(len(changes), watchBatch)
			ev := &pb.PinsWatchEvent{AppliedIndex: applied}
			for _, c := range changes[:n] {
				ev.Changes = append(ev.Changes, changePB(c))
			}
			if err := stream.Send(ev); err != nil {
				return err
			}
			changes = changes[n:]
		}
		last = applied
	}
}

func adapterPB(a Adapter) *pb.Adapter {
	return &pb.Adapter{Id: a.ID, Name: a.Name, BaseModel: a.BaseModel, Revision: a.Revision, Version: a.Version}
}

func pinPB(p AdapterPin) *pb.AdapterPin {
	return &pb.AdapterPin{AdapterId: p.AdapterID, Nodes: p.Nodes, Version: p.Version}
}

func prefixPB(p PrefixPin) *pb.PrefixPin {
	return &pb.PrefixPin{AdapterId: p.AdapterID, PrefixHash: p.Hash, Tokens: p.Tokens, Nodes: p.Nodes, Version: p.Version}
}

func changePB(c Change) *pb.PinChange {
	out := &pb.PinChange{Kind: pb.PinChange_Kind(c.Kind), Index: c.Index}
	switch c.Kind {
	case ChangePutAdapter, ChangeDeleteAdapter:
		out.Adapter = adapterPB(c.Adapter)
	case ChangePinAdapter, ChangeUnpinAdapter:
		out.Pin = pinPB(c.Pin)
	case ChangePinPrefix, ChangeUnpinPrefix:
		out.PrefixPin = prefixPB(c.Prefix)
	}
	return out
}
