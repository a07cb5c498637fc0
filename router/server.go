package router

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prefixmesh/prefixmesh/internal/tokenizer"
	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
	"github.com/prefixmesh/prefixmesh/routing"
)

// MaxPromptTokens bounds a routed prompt: 1 Mi tokens is beyond every model's context, and
// hashing it takes about a millisecond.
const MaxPromptTokens = 1 << 20

// MaxTextBytes bounds a text prompt before tokenising (about 4 bytes per token).
const MaxTextBytes = 4 * MaxPromptTokens

// Config configures a Server.
type Config struct {
	// Policy names a routing policy (routing.PolicyNames). The default is longest-prefix: most
	// estimated matched tokens, ties to the least loaded node, then a rendezvous hash.
	Policy string
	// PolicyConfig tunes the policy.
	PolicyConfig routing.PolicyConfig
	// Tokenizer turns text prompts into tokens; nil means requests must carry tokens.
	Tokenizer tokenizer.Tokenizer
	// Pins restricts a pinned adapter's requests to its nodes (DESIGN.md §6 "Candidates"); nil
	// means no adapter is pinned.
	Pins PinTable
}

// DefaultConfig returns the first version's policy: longest-prefix with routing's defaults.
func DefaultConfig() Config {
	return Config{Policy: routing.PolicyLongestPrefix, PolicyConfig: routing.DefaultPolicyConfig()}
}

// Server is the gRPC Router service. It is safe for concurrent use.
type Server struct {
	pb.UnimplementedRouterServer

	view    *View
	policy  routing.Policy
	tok     tokenizer.Tokenizer
	pins    PinTable
	seed    maphash.Seed
	metrics *metrics
	pool    sync.Pool // *scratch
}

type scratch struct {
	snap     Snapshot
	eligible []int
	nodes    []routing.NodeInfo
	matched  []int
	decision routing.Decision
}

var _ pb.RouterServer = (*Server)(nil)

// NewServer returns a Router service over view; its metrics go to reg (nil: none registered).
func NewServer(view *View, cfg Config, reg prometheus.Registerer) (*Server, error) {
	p, err := routing.NewPolicy(cfg.Policy, cfg.PolicyConfig)
	if err != nil {
		return nil, fmt.Errorf("router: %w", err)
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("router: register metrics: %w", err)
	}
	return &Server{view: view, policy: p, tok: cfg.Tokenizer, pins: cfg.Pins, seed: maphash.MakeSeed(), metrics: m}, nil
}

// Register adds the Router service to g.
func (s *Server) Register(g *grpc.Server) { pb.RegisterRouterServer(g, s) }

// Route implements Router.Route.
func (s *Server) Route(ctx context.Context, req *pb.RouteRequest) (*pb.RouteResponse, error) {
	start := time.Now()
	resp, err := s.route(req, start)
	s.metrics.observe(resp, err, time.Since(start))
	return resp, err
}

func (s *Server) route(req *pb.RouteRequest, now time.Time) (*pb.RouteResponse, error) {
	tokens := req.GetTokens()
	switch {
	case len(tokens) > 0 && req.GetText() != "":
		return nil, status.Error(codes.InvalidArgument, "route: give tokens or text, not both")
	case len(tokens) > MaxPromptTokens:
		return nil, status.Errorf(codes.InvalidArgument, "route: tokens: %d tokens (max %d)", len(tokens), MaxPromptTokens)
	case len(tokens) == 0 && req.GetText() == "":
		return nil, status.Error(codes.InvalidArgument, "route: tokens or text is required")
	case len(tokens) == 0:
		if s.tok == nil {
			return nil, status.Error(codes.InvalidArgument, "route: text: this router has no tokenizer; send tokens")
		}
		if len(req.GetText()) > MaxTextBytes {
			return nil, status.Errorf(codes.InvalidArgument, "route: text: %d bytes (max %d)", len(req.GetText()), MaxTextBytes)
		}
		var err error
		if tokens, err = tokenizer.EncodePrompt(context.Background(), s.tok, req.GetText()); err != nil {
			return nil, status.Errorf(codes.Unavailable, "route: tokenize the text: %v", err)
		}
	}
	sc, _ := s.pool.Get().(*scratch)
	if sc == nil {
		sc = new(scratch)
	}
	defer s.pool.Put(sc)
	s.view.For(tokens, req.GetAdapterId(), &sc.snap)
	sn := &sc.snap
	allowed, pinned := allowedFilter(s.pins, req.GetAdapterId())
	sc.eligible = routing.AppendEligible(sc.eligible[:0], sn.Nodes, req.GetModel(), allowed)
	if len(sc.eligible) == 0 && allowed != nil {
		return nil, status.Errorf(codes.Unavailable, "route: no eligible node (of %d synced) for model %q: adapter %d is pinned to %v",
			len(sn.Nodes), req.GetModel(), req.GetAdapterId(), pinned)
	}
	if len(sc.eligible) == 0 {
		return nil, status.Errorf(codes.Unavailable, "route: no eligible node (of %d synced) for model %q", len(sn.Nodes), req.GetModel())
	}
	sc.nodes, sc.matched = sc.nodes[:0], sc.matched[:0]
	for _, i := range sc.eligible {
		sc.nodes = append(sc.nodes, sn.Nodes[i])
		sc.matched = append(sc.matched, sn.MatchedTokens[i])
	}
	rr := routing.Request{
		Hashes:       sn.Hashes,
		PromptTokens: len(tokens),
		AdapterID:    req.GetAdapterId(),
		Model:        req.GetModel(),
		BlockSize:    sn.BlockSize,
	}
	if id := req.GetSessionId(); id != "" {
		rr.SessionKey = maphash.String(s.seed, id) | 1
	}
	if err := s.policy.Choose(&rr, sc.nodes, sc.matched, now, &sc.decision); err != nil {
		if errors.Is(err, routing.ErrNoCandidates) {
			return nil, status.Error(codes.Unavailable, "route: no eligible node")
		}
		return nil, status.Errorf(codes.Internal, "route: %v", err)
	}
	d := &sc.decision
	chosen := sn.Meta[sc.eligible[d.Node]]
	resp := &pb.RouteResponse{
		NodeId:                 chosen.NodeID,
		GrpcAddress:            chosen.GRPCAddr,
		EngineUrl:              chosen.EngineURL,
		EstimatedMatchedTokens: int64(d.MatchedTokens),
		Reason:                 d.Reason,
		PromptTokens:           int64(len(tokens)),
	}
	for _, c := range d.Candidates {
		score := c.Score
		if math.IsNaN(score) {
			score = math.Inf(1)
		}
		resp.Candidates = append(resp.Candidates, &pb.RouteCandidate{
			NodeId:                 sc.nodes[c.Node].ID,
			EstimatedMatchedTokens: int64(c.MatchedTokens),
			Load:                   c.Load,
			Score:                  score,
		})
	}
	return resp, nil
}
