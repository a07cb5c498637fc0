package pins

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// notLeaderReason is the google.rpc.ErrorInfo reason of a PinsPeer call that reached a member
// that is not the leader: the caller looks the leader up again and retries (nothing was applied).
const notLeaderReason = "PINS_NOT_LEADER"

// errorDomain is the ErrorInfo domain of this package's errors.
const errorDomain = "pins.prefixmesh.io"

// forwarder holds one gRPC client connection per leader address.
type forwarder struct {
	opts []grpc.DialOption

	mu    sync.Mutex // guards conns
	conns map[string]*grpc.ClientConn
}

func newForwarder(opts []grpc.DialOption) *forwarder {
	if len(opts) == 0 {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	return &forwarder{opts: opts, conns: map[string]*grpc.ClientConn{}}
}

func (f *forwarder) client(addr string) (pb.PinsPeerClient, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conns == nil {
		return nil, ErrClosed
	}
	cc, ok := f.conns[addr]
	if !ok {
		var err error
		if cc, err = grpc.NewClient(addr, f.opts...); err != nil {
			return nil, fmt.Errorf("%w: dial leader %s: %w", ErrUnavailable, addr, err)
		}
		f.conns[addr] = cc
	}
	return pb.NewPinsPeerClient(cc), nil
}

// propose forwards an encoded command to the leader at addr.
func (f *forwarder) propose(ctx context.Context, addr string, cmd []byte) (Result, error) {
	c, err := f.client(addr)
	if err != nil {
		return Result{}, err
	}
	resp, err := c.Propose(ctx, &pb.PinsProposeRequest{Command: cmd})
	if err != nil {
		return Result{}, fmt.Errorf("forward to leader at %s: %w", addr, fromPeerStatus(err))
	}
	return decodeResult(resp.GetResult())
}

// toLeader runs call, a PinsPeer call to the leader id, abandoning it when this member sees
// another leader elected meanwhile: a frozen leader never answers, and the caller's deadline
// would otherwise pass on it though a new leader was elected seconds in. An abandoned
// call's outcome is unknown (ErrUnavailable): a write may still have been replicated.
func (s *Store) toLeader(ctx context.Context, id string, call func(context.Context) error) error {
	actx, cancel := context.WithCancel(ctx)
	var moved atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(s.cfg.HeartbeatTimeout / 4)
		defer t.Stop()
		for {
			select {
			case <-actx.Done():
				return
			case <-t.C:
				if _, lid := s.raft.LeaderWithID(); lid != "" && string(lid) != id {
					moved.Store(true)
					cancel()
					return
				}
			}
		}
	}()
	err := call(actx)
	cancel()
	<-done
	if err != nil && moved.Load() && !errors.Is(err, ErrNotLeader) {
		return fmt.Errorf("%w: leadership moved from %s while the call was in flight: %w", ErrUnavailable, id, err)
	}
	return err
}

// forward sends an encoded command to the leader (id, at addr); see toLeader.
func (s *Store) forward(ctx context.Context, addr, id string, b []byte) (Result, error) {
	var r Result
	err := s.toLeader(ctx, id, func(ctx context.Context) error {
		var err error
		r, err = s.fwd.propose(ctx, addr, b)
		return err
	})
	return r, err
}

// readIndex asks the leader at addr for its read index.
func (f *forwarder) readIndex(ctx context.Context, addr string) (uint64, error) {
	c, err := f.client(addr)
	if err != nil {
		return 0, err
	}
	resp, err := c.ReadIndex(ctx, &pb.PinsReadIndexRequest{})
	if err != nil {
		return 0, fmt.Errorf("read index from leader at %s: %w", addr, fromPeerStatus(err))
	}
	return resp.GetIndex(), nil
}

func (f *forwarder) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, cc := range f.conns {
		_ = cc.Close()
	}
	f.conns = nil
}

// fromPeerStatus maps a PinsPeer error to a sentinel. Anything but an explicit "not leader" is
// ErrUnavailable: the call may have reached the leader, so the write's outcome is unknown and it
// must not be retried blindly.
func fromPeerStatus(err error) error {
	st := status.Convert(err)
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetReason() == notLeaderReason {
			return fmt.Errorf("%w: %s", ErrNotLeader, st.Message())
		}
	}
	// grpc-go fails an RPC with "connection error" when no connection to the callee could be
	// made: the request never left this process, so a retry (after looking the leader up again,
	// it probably just died) cannot apply the command twice.
	if st.Code() == codes.Unavailable && strings.HasPrefix(st.Message(), "connection error") {
		return fmt.Errorf("%w: leader unreachable: %s", ErrNotLeader, st.Message())
	}
	if st.Code() == codes.InvalidArgument {
		return fmt.Errorf("%w: %s", ErrInvalid, st.Message())
	}
	return fmt.Errorf("%w: %s: %s", ErrUnavailable, st.Code(), st.Message())
}

// peerServer serves PinsPeer on the leader.
type peerServer struct {
	pb.UnimplementedPinsPeerServer
	s *Store
}

func notLeaderStatus() error {
	st, err := status.New(codes.FailedPrecondition, "not the pins leader").
		WithDetails(&errdetails.ErrorInfo{Reason: notLeaderReason, Domain: errorDomain})
	if err != nil {
		return status.Error(codes.FailedPrecondition, "not the pins leader")
	}
	return st.Err()
}

// Propose applies a forwarded command; it never forwards again.
func (p peerServer) Propose(ctx context.Context, req *pb.PinsProposeRequest) (*pb.PinsProposeResponse, error) {
	if _, err := DecodeCommand(req.GetCommand()); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	ctx, cancel := p.s.withDeadline(ctx)
	defer cancel()
	r, err := p.s.applyLocal(ctx, req.GetCommand())
	switch {
	case err == nil:
		return &pb.PinsProposeResponse{Result: encodeResult(r)}, nil
	case errors.Is(err, ErrNotLeader):
		return nil, notLeaderStatus()
	default:
		return nil, status.Error(codes.Unavailable, err.Error())
	}
}

// ReadIndex returns the leader's read index.
func (p peerServer) ReadIndex(ctx context.Context, _ *pb.PinsReadIndexRequest) (*pb.PinsReadIndexResponse, error) {
	ctx, cancel := p.s.withDeadline(ctx)
	defer cancel()
	idx, err := p.s.readIndexLocal(ctx)
	switch {
	case err == nil:
		return &pb.PinsReadIndexResponse{Index: idx}, nil
	case errors.Is(err, ErrNotLeader):
		return nil, notLeaderStatus()
	default:
		return nil, status.Error(codes.Unavailable, err.Error())
	}
}
