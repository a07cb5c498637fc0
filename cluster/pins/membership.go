package pins

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/hashicorp/raft"
)

// Member is a live router as the gossip layer sees it.
type Member struct {
	ID       string // raft server id (the node id)
	RaftAddr string // raft transport address
	GRPCAddr string // Pins gRPC address
}

// Server is one server of the Raft configuration as a member knows it.
type Server struct {
	ID       string
	RaftAddr string
	GRPCAddr string // "" when this member has not learnt it
	Voter    bool
}

// Membership is a member's view of the Raft configuration (`pins members`).
type Membership struct {
	Servers  []Server // by id
	LeaderID string   // "" when this member knows no leader
	Self     string   // this member's id
	State    string   // Leader, Follower, Candidate or Shutdown
	Term     uint64
	// LastContact is when this member last heard from the leader (zero on the leader itself
	// and before any contact); Staleness is the bound it implies on local reads.
	LastContact time.Time
	Staleness   time.Duration
	Applied     uint64
}

// Membership returns this member's view of the Raft configuration. Local; no quorum needed.
func (s *Store) Membership() (Membership, error) {
	f := s.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return Membership{}, fmt.Errorf("membership: get configuration: %w", mapRaftErr(err))
	}
	leader, _ := s.Leader()
	m := Membership{LeaderID: leader, Self: s.cfg.ServerID, State: s.raft.State().String(),
		Staleness: s.Staleness(), Applied: s.fsm.AppliedIndex()}
	if t, err := strconv.ParseUint(s.raft.Stats()["term"], 10, 64); err == nil {
		m.Term = t
	}
	if s.raft.State() != raft.Leader {
		m.LastContact = s.raft.LastContact()
	}
	for _, srv := range f.Configuration().Servers {
		id := string(srv.ID)
		m.Servers = append(m.Servers, Server{ID: id, RaftAddr: string(srv.Address), GRPCAddr: s.peerAddr(id), Voter: srv.Suffrage == raft.Voter})
	}
	slices.SortFunc(m.Servers, func(a, b Server) int { return cmp.Compare(a.ID, b.ID) })
	return m, nil
}

// AddVoter adds (or re-addresses) a voter. Only the leader can; others get ErrNotLeader.
func (s *Store) AddVoter(ctx context.Context, id, raftAddr string) error {
	ctx, cancel := s.withDeadline(ctx)
	defer cancel()
	if s.raft.State() != raft.Leader {
		return ErrNotLeader
	}
	if err := wait(ctx, s.raft.AddVoter(raft.ServerID(id), raft.ServerAddress(raftAddr), 0, timeUntil(ctx))); err != nil {
		return fmt.Errorf("add voter %s: %w", id, err)
	}
	return nil
}

// RemoveServer removes a server from the configuration. Only the leader can.
func (s *Store) RemoveServer(ctx context.Context, id string) error {
	ctx, cancel := s.withDeadline(ctx)
	defer cancel()
	if s.raft.State() != raft.Leader {
		return ErrNotLeader
	}
	if err := wait(ctx, s.raft.RemoveServer(raft.ServerID(id), 0, timeUntil(ctx))); err != nil {
		return fmt.Errorf("remove server %s: %w", id, err)
	}
	return nil
}

// Reconcile brings the raft configuration in line with the live members the gossip layer reports
// (this member included or not): it records every member's gRPC address; on the leader it then
// removes one server that is no longer live (one per call), re-addresses voters whose raft
// address changed and adds live members as voters, in id order, until Config.Voters voters. On a follower it only
// records addresses and returns nil. Call it on every membership change; it is idempotent.
func (s *Store) Reconcile(ctx context.Context, members []Member) error {
	for _, m := range members {
		if m.ID != "" && m.GRPCAddr != "" {
			s.SetPeer(m.ID, m.GRPCAddr)
		}
	}
	if s.raft.State() != raft.Leader {
		return nil
	}
	f := s.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return fmt.Errorf("reconcile: get configuration: %w", err)
	}
	live := map[string]Member{}
	for _, m := range members {
		if m.ID != "" && m.RaftAddr != "" {
			live[m.ID] = m
		}
	}
	var errs []error
	voters := 0
	removed := false
	known := map[string]bool{}
	for _, srv := range f.Configuration().Servers {
		id := string(srv.ID)
		known[id] = true
		m, ok := live[id]
		switch {
		case id == s.cfg.ServerID:
			voters++
		case !ok && removed:
			// At most one removal per call: a gossip view that is briefly wrong about many
			// members must not shrink the configuration below quorum in one go.
			if srv.Suffrage == raft.Voter {
				voters++
			}
		case !ok:
			removed = true
			if err := s.RemoveServer(ctx, id); err != nil {
				errs = append(errs, err)
			}
		case srv.Suffrage == raft.Voter && m.RaftAddr != string(srv.Address):
			voters++
			if err := s.AddVoter(ctx, id, m.RaftAddr); err != nil {
				errs = append(errs, err)
			}
		case srv.Suffrage == raft.Voter:
			voters++
		}
	}
	cands := make([]Member, 0, len(live))
	for id, m := range live {
		if !known[id] {
			cands = append(cands, m)
		}
	}
	slices.SortFunc(cands, func(a, b Member) int { return cmp.Compare(a.ID, b.ID) })
	for _, m := range cands {
		if voters >= s.cfg.Voters {
			break
		}
		if err := s.AddVoter(ctx, m.ID, m.RaftAddr); err != nil {
			errs = append(errs, err)
			continue
		}
		voters++
	}
	return errors.Join(errs...)
}
