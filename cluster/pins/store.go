package pins

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
)

// Store is one member of the replicated pin table: a raft node with its FSM, plus forwarding of
// writes and read-index requests to the leader. Create it with New, then Start; stop it with
// Shutdown.
type Store struct {
	cfg     Config
	fsm     *FSM
	fwd     *forwarder
	metrics *metrics
	started time.Time

	raft   *raft.Raft
	trans  *raft.NetworkTransport
	bolt   *raftboltdb.BoltStore
	obs    *raft.Observer
	obsCh  chan raft.Observation
	cancel context.CancelFunc
	wg     sync.WaitGroup // joins the observer goroutine

	peersMu sync.RWMutex      // guards peers
	peers   map[string]string // raft server id → gRPC address (config and Reconcile)

	leaderSeen atomic.Uint64 // leader observations, for tests
	closed     atomic.Bool
}

// New checks cfg and returns a Store that does nothing until Start.
func New(cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Store{cfg: cfg, fsm: NewFSM(), peers: map[string]string{}}
	for id, addr := range cfg.Peers {
		s.peers[id] = addr
	}
	s.fwd = newForwarder(cfg.PeerDialOptions)
	s.metrics = newMetrics(s)
	if cfg.Registerer != nil {
		if err := s.metrics.register(cfg.Registerer); err != nil {
			return nil, fmt.Errorf("register pins metrics: %w", err)
		}
	}
	return s, nil
}

// Start opens the bolt log and snapshot store in DataDir, listens on RaftBind, starts raft and
// bootstraps a one-voter cluster when Config.Bootstrap is set and there is no state yet. It does
// not block on an election.
func (s *Store) Start(ctx context.Context) error {
	cfg := s.cfg
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("create pins data dir: %w", err)
	}
	logger := hclog.New(&hclog.LoggerOptions{Name: "pins-raft-" + cfg.ServerID, Output: cfg.LogOutput, Level: hclog.LevelFromString(cfg.LogLevel)})
	bolt, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(cfg.DataDir, "raft.db")})
	if err != nil {
		return fmt.Errorf("open raft log: %w", err)
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(cfg.DataDir, cfg.SnapshotRetain, logger)
	if err != nil {
		_ = bolt.Close()
		return fmt.Errorf("open raft snapshots: %w", err)
	}
	stream, err := newStreamLayer(cfg.RaftBind, cfg.RaftAdvertise, cfg.ServerTLS, cfg.ClientTLS)
	if err != nil {
		_ = bolt.Close()
		return fmt.Errorf("listen for raft: %w", err)
	}
	var sl raft.StreamLayer = stream
	if cfg.WrapStream != nil {
		sl = cfg.WrapStream(sl)
	}
	trans := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream: sl, MaxPool: cfg.MaxPool, Timeout: cfg.TransportTimeout, Logger: logger,
	})
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.ServerID)
	rc.Logger = logger
	rc.HeartbeatTimeout = cfg.HeartbeatTimeout
	rc.ElectionTimeout = cfg.ElectionTimeout
	rc.LeaderLeaseTimeout = cfg.LeaderLeaseTimeout
	rc.CommitTimeout = cfg.CommitTimeout
	rc.SnapshotThreshold = cfg.SnapshotThreshold
	rc.SnapshotInterval = cfg.SnapshotInterval
	rc.TrailingLogs = cfg.TrailingLogs
	fail := func(err error) error {
		_ = trans.Close()
		_ = bolt.Close()
		return err
	}
	if cfg.Bootstrap {
		has, err := raft.HasExistingState(bolt, bolt, snaps)
		if err != nil {
			return fail(fmt.Errorf("inspect raft state: %w", err))
		}
		if !has {
			boot := raft.Configuration{Servers: []raft.Server{{ID: rc.LocalID, Address: trans.LocalAddr(), Suffrage: raft.Voter}}}
			if err := raft.BootstrapCluster(rc, bolt, bolt, snaps, trans, boot); err != nil {
				return fail(fmt.Errorf("bootstrap raft: %w", err))
			}
		}
	}
	r, err := raft.NewRaft(rc, s.fsm, bolt, bolt, snaps, trans)
	if err != nil {
		return fail(fmt.Errorf("start raft: %w", err))
	}
	s.raft, s.trans, s.bolt, s.started = r, trans, bolt, time.Now()
	// A non-blocking observer: raft drops observations rather than wait for us (a raft
	// callback must never block).
	s.obsCh = make(chan raft.Observation, 64)
	s.obs = raft.NewObserver(s.obsCh, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.LeaderObservation)
		return ok
	})
	r.RegisterObserver(s.obs)
	octx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.cancel = cancel
	s.wg.Add(1)
	go s.observe(octx)
	return nil
}

// observe counts leader changes and, when this member becomes leader, records its gRPC address
// in the table so followers can forward to it.
func (s *Store) observe(ctx context.Context) {
	defer s.wg.Done()
	var last raft.ServerID
	for {
		select {
		case <-ctx.Done():
			return
		case o := <-s.obsCh:
			lo := o.Data.(raft.LeaderObservation)
			s.leaderSeen.Add(1)
			if lo.LeaderID != last && lo.LeaderID != "" {
				s.metrics.leaderChanges.Inc()
			}
			last = lo.LeaderID
			if lo.LeaderID == raft.ServerID(s.cfg.ServerID) && s.cfg.GRPCAddr != "" {
				if addr, ok := s.fsm.ServerAddr(s.cfg.ServerID); !ok || addr != s.cfg.GRPCAddr {
					s.wg.Add(1)
					go func() {
						defer s.wg.Done()
						wctx, cancel := context.WithTimeout(ctx, s.cfg.WriteTimeout)
						defer cancel()
						// Best effort: a failure means leadership moved on, and the next
						// leader registers itself.
						_, _ = s.Write(wctx, Command{Op: OpSetServer, ServerID: s.cfg.ServerID, Addr: s.cfg.GRPCAddr})
					}()
				}
			}
		}
	}
}

// FSM returns the state machine, for reads.
func (s *Store) FSM() *FSM { return s.fsm }

// ID returns this member's raft server id.
func (s *Store) ID() string { return s.cfg.ServerID }

// RaftAddr returns the address other members reach this one's raft transport at.
func (s *Store) RaftAddr() string { return string(s.trans.LocalAddr()) }

// IsLeader reports whether this member is the raft leader.
func (s *Store) IsLeader() bool { return s.raft.State() == raft.Leader }

// Leader returns the current leader's id and raft address as this member knows them ("" if none).
func (s *Store) Leader() (id, raftAddr string) {
	a, i := s.raft.LeaderWithID()
	return string(i), string(a)
}

// Staleness bounds how old this member's table may be: 0 on the leader, otherwise the time since
// it last heard from a leader (since Start if never).
func (s *Store) Staleness() time.Duration {
	if s.raft.State() == raft.Leader {
		return 0
	}
	lc := s.raft.LastContact()
	if lc.IsZero() {
		return time.Since(s.started)
	}
	return time.Since(lc)
}

// AllowedNodes returns the nodes the router may send adapter's requests to, and whether the
// adapter is pinned at all (false: any node). Local read; see Staleness. The slice is shared:
// do not modify it.
func (s *Store) AllowedNodes(adapter uint64) (nodes []string, pinned bool) {
	return s.fsm.AllowedNodes(adapter)
}

// PrefixPinsFor returns the prefix pins that name node. Local read.
func (s *Store) PrefixPinsFor(node string) []PrefixPin { return s.fsm.PrefixPinsFor(node) }

// Subscribe signals (coalesced) after every change of the local table; see FSM.Subscribe.
func (s *Store) Subscribe() (<-chan struct{}, func()) { return s.fsm.Subscribe() }

// View returns the local table.
func (s *Store) View() View { return s.fsm.View() }

// withDeadline bounds ctx by the configured write timeout if it has no deadline.
func (s *Store) withDeadline(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, s.cfg.WriteTimeout)
}

// Write normalizes, validates and applies c through the leader (forwarding from a follower).
// It returns the Result on success; on failure the error wraps ErrInvalid, ErrNotFound,
// ErrLimit, a *VersionError, ErrUnavailable (no leader or quorum before the deadline; the write
// may still be applied later) or ErrClosed.
func (s *Store) Write(ctx context.Context, c Command) (Result, error) {
	c.Normalize()
	if err := c.Validate(); err != nil {
		return Result{}, err
	}
	b := c.Encode()
	if len(b) > MaxCommandBytes {
		return Result{}, fmt.Errorf("%w: command is %d bytes, over the limit of %d", ErrInvalid, len(b), MaxCommandBytes)
	}
	start := time.Now()
	r, err := s.propose(ctx, b, c.Cond.Set)
	if err == nil && r.Err != nil {
		err = r.Err
	}
	s.metrics.observeWrite(time.Since(start), err)
	return r, err
}

// propose applies an encoded, valid command on the leader, wherever it is. A command rejected
// before it reached any log (not leader, leader unreachable) is retried until ctx ends. A
// compare-and-set (cas) is also retried after an attempt with an unknown outcome (a leader
// that froze or died mid-call, leadership lost mid-commit): its version condition lets at most
// one attempt apply. If a retry then finds the version moved, the earlier attempt may be what
// moved it, so that outcome is reported as ErrUnavailable (unknown) naming the mismatch, never
// as a plain *VersionError.
func (s *Store) propose(ctx context.Context, b []byte, cas bool) (Result, error) {
	ctx, cancel := s.withDeadline(ctx)
	defer cancel()
	ambiguous := false
	for {
		if s.closed.Load() {
			return Result{}, ErrClosed
		}
		var r Result
		var err error
		if s.raft.State() == raft.Leader {
			r, err = s.applyLocal(ctx, b)
		} else {
			var addr, id string
			if addr, id, err = s.leaderGRPC(ctx); err == nil {
				r, err = s.forward(ctx, addr, id, b)
			}
		}
		switch {
		case errors.Is(err, ErrNotLeader):
			// Rejected before it reached any log: safe to retry once leadership settles.
		case cas && ctx.Err() == nil && errors.Is(err, ErrUnavailable):
			ambiguous = true
			s.metrics.forwardRetries.Inc()
		default:
			var ve *VersionError
			if err == nil && ambiguous && errors.As(r.Err, &ve) {
				// Not %w: this is no plain mismatch, and callers that test for one must not see it.
				r.Err = fmt.Errorf("%w: an earlier attempt had an unknown outcome and may have applied (retry found: %v)", ErrUnavailable, ve)
			}
			return r, err
		}
		if werr := s.pause(ctx); werr != nil {
			return Result{}, werr
		}
	}
}

// pause waits a little before a retry, bounded by ctx.
func (s *Store) pause(ctx context.Context) error {
	t := time.NewTimer(s.cfg.HeartbeatTimeout / 4)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", ErrUnavailable, ctx.Err())
	case <-t.C:
		return nil
	}
}

// leaderGRPC waits (bounded by ctx) for a known leader and returns its gRPC address and id.
func (s *Store) leaderGRPC(ctx context.Context) (addr, id string, err error) {
	for {
		_, lid := s.raft.LeaderWithID()
		if lid == raft.ServerID(s.cfg.ServerID) {
			return "", "", ErrNotLeader // we just became leader: retry locally
		}
		if lid != "" {
			if addr := s.peerAddr(string(lid)); addr != "" {
				return addr, string(lid), nil
			}
		}
		if err := s.pause(ctx); err != nil {
			if lid != "" {
				return "", "", fmt.Errorf("%w: no gRPC address known for leader %s", ErrUnavailable, lid)
			}
			return "", "", fmt.Errorf("%w: no leader", err)
		}
	}
}

// peerAddr returns a server's gRPC address from config/Reconcile, else from the table.
func (s *Store) peerAddr(id string) string {
	s.peersMu.RLock()
	addr := s.peers[id]
	s.peersMu.RUnlock()
	if addr != "" {
		return addr
	}
	addr, _ = s.fsm.ServerAddr(id)
	return addr
}

// SetPeer records the gRPC address of a raft server (the gossip layer learns them).
func (s *Store) SetPeer(id, grpcAddr string) {
	s.peersMu.Lock()
	s.peers[id] = grpcAddr
	s.peersMu.Unlock()
}

// wait returns f's error, or ErrUnavailable when ctx ends first. The helper goroutine ends when
// raft resolves the future, which it does at the latest when it shuts down.
func wait(ctx context.Context, f raft.Future) error {
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	select {
	case err := <-done:
		return mapRaftErr(err)
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", ErrUnavailable, ctx.Err())
	}
}

// mapRaftErr turns raft's errors into this package's sentinels.
func mapRaftErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipTransferInProgress):
		return fmt.Errorf("%w: %w", ErrNotLeader, err)
	case errors.Is(err, raft.ErrRaftShutdown):
		return fmt.Errorf("%w: %w", ErrClosed, err)
	default: // leadership lost mid-commit, enqueue timeout, …: outcome unknown, retryable
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
}

// applyLocal applies b on this member, which must be the leader.
func (s *Store) applyLocal(ctx context.Context, b []byte) (Result, error) {
	f := s.raft.Apply(b, timeUntil(ctx))
	if err := wait(ctx, f); err != nil {
		return Result{}, err
	}
	r, ok := f.Response().(Result)
	if !ok {
		return Result{}, fmt.Errorf("%w: unexpected apply response %T", ErrCorrupt, f.Response())
	}
	return r, nil
}

// timeUntil returns the time left before ctx's deadline (at least 1 ms).
func timeUntil(ctx context.Context) time.Duration {
	if dl, ok := ctx.Deadline(); ok {
		return max(time.Until(dl), time.Millisecond)
	}
	return 0
}

// readIndexLocal confirms leadership with a quorum, commits a barrier (so every entry of earlier
// terms is applied here) and returns the applied index: the read index of a linearizable read.
func (s *Store) readIndexLocal(ctx context.Context) (uint64, error) {
	if s.raft.State() != raft.Leader {
		return 0, ErrNotLeader
	}
	if err := wait(ctx, s.raft.VerifyLeader()); err != nil {
		return 0, err
	}
	if err := wait(ctx, s.raft.Barrier(timeUntil(ctx))); err != nil {
		return 0, err
	}
	return s.fsm.AppliedIndex(), nil
}

// Sync makes the local table linearizable: when it returns nil, local reads reflect every write
// acknowledged before Sync was called. It asks the leader for its read index (forwarding from a
// follower, retrying through leader changes) and waits until this member has applied up to it.
// Without quorum it fails with ErrUnavailable when ctx (or the write timeout) ends.
func (s *Store) Sync(ctx context.Context) error {
	ctx, cancel := s.withDeadline(ctx)
	defer cancel()
	for {
		var idx uint64
		var err error
		if s.raft.State() == raft.Leader {
			idx, err = s.readIndexLocal(ctx)
		} else {
			var addr, id string
			if addr, id, err = s.leaderGRPC(ctx); err == nil {
				err = s.toLeader(ctx, id, func(ctx context.Context) error {
					var err error
					idx, err = s.fwd.readIndex(ctx, addr)
					return err
				})
			}
		}
		// A read index changes nothing, so any failure with time left is retried: not the
		// leader, a leader that froze or died mid-call, leadership lost at the barrier.
		if errors.Is(err, ErrNotLeader) || (errors.Is(err, ErrUnavailable) && ctx.Err() == nil) {
			if werr := s.pause(ctx); werr != nil {
				return werr
			}
			continue
		}
		if err != nil {
			return err
		}
		return s.waitApplied(ctx, idx)
	}
}

// waitApplied waits until the local FSM has applied idx, bounded by ctx.
func (s *Store) waitApplied(ctx context.Context, idx uint64) error {
	ch, stop := s.fsm.Subscribe()
	defer stop()
	for s.fsm.AppliedIndex() < idx {
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("%w: waiting to apply index %d: %w", ErrUnavailable, idx, ctx.Err())
		}
	}
	return nil
}

// Shutdown stops the member: the leader first hands leadership to another voter (bounded by
// ctx), then raft stops and the log and transport close.
func (s *Store) Shutdown(ctx context.Context) error {
	if s.raft != nil && s.raft.State() == raft.Leader && s.voters() > 1 {
		// Best effort: on failure the others elect a leader after ElectionTimeout.
		_ = wait(ctx, s.raft.LeadershipTransfer())
	}
	return s.stop()
}

// stop shuts down without handing over leadership (a crash, for the others).
func (s *Store) stop() error {
	if !s.closed.CompareAndSwap(false, true) || s.raft == nil {
		return nil
	}
	err := s.raft.Shutdown().Error()
	s.raft.DeregisterObserver(s.obs)
	s.cancel()
	s.wg.Wait()
	err = errors.Join(err, s.trans.Close(), s.bolt.Close())
	s.fwd.close()
	if err != nil {
		return fmt.Errorf("shut down pins store: %w", err)
	}
	return nil
}

// voters counts the voters of the latest configuration.
func (s *Store) voters() int {
	f := s.raft.GetConfiguration()
	if f.Error() != nil {
		return 0
	}
	n := 0
	for _, srv := range f.Configuration().Servers {
		if srv.Suffrage == raft.Voter {
			n++
		}
	}
	return n
}
