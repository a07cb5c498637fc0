package main

import (
	"context"
	"encoding/json"
	"fmt"
	"text/tabwriter"

	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
)

// membersJSON is `pins members --json`: the answering member's view, and each server's own
// answer (its state and last contact with the leader) or the error reaching it.
type membersJSON struct {
	ServerID           string       `json:"server_id"`
	LeaderID           string       `json:"leader_id"`
	State              string       `json:"state"`
	Term               uint64       `json:"term"`
	LastContactSeconds float64      `json:"last_contact_seconds"`
	Servers            []serverJSON `json:"servers"`
}

type serverJSON struct {
	ID                 string   `json:"id"`
	RaftAddress        string   `json:"raft_address"`
	GRPCAddress        string   `json:"grpc_address"`
	Voter              bool     `json:"voter"`
	Leader             bool     `json:"leader"`
	State              string   `json:"state,omitempty"`
	LastContactSeconds *float64 `json:"last_contact_seconds,omitempty"`
	AppliedIndex       uint64   `json:"applied_index,omitempty"`
	Error              string   `json:"error,omitempty"`
}

// members prints the Raft configuration as the addressed router knows it, then asks every
// server with a known gRPC address for its own state and last contact (within the call's
// deadline), so a follower that lost the leader shows up as such.
func (p *pinsCLI) members(ctx context.Context) error {
	resp, err := p.client.Members(ctx, &pb.PinsMembersRequest{})
	if err != nil {
		return err
	}
	out := membersJSON{ServerID: resp.GetServerId(), LeaderID: resp.GetLeaderId(), State: resp.GetState(),
		Term: resp.GetTerm(), LastContactSeconds: resp.GetLastContactSeconds(), Servers: []serverJSON{}}
	for _, srv := range resp.GetServers() {
		sj := serverJSON{ID: srv.GetId(), RaftAddress: srv.GetRaftAddress(), GRPCAddress: srv.GetGrpcAddress(), Voter: srv.GetVoter(), Leader: srv.GetLeader()}
		var own *pb.PinsMembersResponse
		switch {
		case srv.GetId() == resp.GetServerId():
			own = resp
		case srv.GetGrpcAddress() == "":
			sj.Error = "gRPC address unknown"
		default:
			own, err = p.askMember(ctx, srv.GetGrpcAddress())
			if err != nil {
				sj.Error = describeRPCError(err)
			}
		}
		if own != nil {
			lc := own.GetLastContactSeconds()
			sj.State, sj.LastContactSeconds, sj.AppliedIndex = own.GetState(), &lc, own.GetAppliedIndex()
		}
		out.Servers = append(out.Servers, sj)
	}
	if p.json {
		return json.NewEncoder(p.stdout).Encode(out)
	}
	leader := out.LeaderID
	if leader == "" {
		leader = "none"
	}
	fmt.Fprintf(p.stdout, "answered by %s (%s, term %d), leader %s\n\n", out.ServerID, out.State, out.Term, leader)
	w := tabwriter.NewWriter(p.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "SERVER\tRAFT ADDRESS\tGRPC ADDRESS\tSUFFRAGE\tSTATE\tLAST CONTACT\tAPPLIED")
	for _, s := range out.Servers {
		suffrage := "nonvoter"
		if s.Voter {
			suffrage = "voter"
		}
		state, contact, applied := "-", "unreachable", "-" // the error itself is in --json
		if s.GRPCAddress == "" {
			contact = "gRPC address unknown"
		}
		if s.LastContactSeconds != nil {
			state, applied = s.State, fmt.Sprint(s.AppliedIndex)
			contact = lastContact(*s.LastContactSeconds, s.Leader)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, dash(s.RaftAddress), dash(s.GRPCAddress), suffrage, state, contact, applied)
	}
	return w.Flush()
}

func (p *pinsCLI) askMember(ctx context.Context, addr string) (*pb.PinsMembersResponse, error) {
	cc, err := p.dial(addr)
	if err != nil {
		return nil, err
	}
	defer cc.Close()
	return pb.NewPinsClient(cc).Members(ctx, &pb.PinsMembersRequest{})
}

func lastContact(sec float64, leader bool) string {
	switch {
	case leader:
		return "is leader"
	case sec < 0:
		return "never"
	}
	return fmt.Sprintf("%.3fs ago", sec)
}
