package router

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prefixmesh/prefixmesh/internal/openai"
	"github.com/prefixmesh/prefixmesh/internal/tokenizer"
	"github.com/prefixmesh/prefixmesh/internal/tracing/spans"
	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
	"github.com/prefixmesh/prefixmesh/router/flow"
	"github.com/prefixmesh/prefixmesh/router/requests"
	"github.com/prefixmesh/prefixmesh/routing"
)

// MaxTextBytes bounds a text prompt before tokenising: about 4 bytes per token of the one prompt
// token cap of every door (requests.MaxPromptTokens).
const MaxTextBytes = 4 * requests.MaxPromptTokens

// Config configures a Server.
type Config struct {
	// Policy names a routing policy (routing.PolicyNames). The default is longest-prefix: most
	// estimated matched tokens, ties to the least loaded node, then a rendezvous hash.
	Policy string
	// PolicyConfig tunes the policy.
	PolicyConfig routing.PolicyConfig
	// Tokenizer turns text prompts into tokens; nil means requests must carry tokens.
	Tokenizer tokenizer.Tokenizer
	// Pins restricts a pinned adapter's requests to its nodes (docs/architecture.md, "One request",
	// step 5); nil
	// means no adapter is pinned.
	Pins PinTable
	// Ejector, when set, keeps out of the candidates the nodes passive health has ejected
	// (requests.Health, the request service's), so every door chooses among the same nodes.
	Ejector requests.Ejector
	// Decider is the decision path shared with the request service's picker and the sharer, so
	// that every door decides with the same code and state (Policy and PolicyConfig are then the decider's); nil
	// builds one over the view's index with an overlay of its own.
	Decider *routing.Decider
	// Flow, when set, is flow control (router/flow), shared with the other doors: each Route
	// (but a dry run) is admitted by it before it is tokenised and decided; a request it sheds
	// is answered ResourceExhausted with the reason and a retry-after trailer. nil: off.
	Flow flow.Admitter
	// TracerProvider, when set and not the no-op provider (internal/tracing), traces each Route
	// call: a server span whose parent is the caller's traceparent (gRPC metadata), with tokenize
	// (text prompts) and decide under it. nil (default): no span work at all.
	TracerProvider trace.TracerProvider
	// Disaggregate is when a request's prefill runs on a prefill node (routing.PlanPrefill):
	// auto (the zero value) when it reaches the first token sooner, always, or never. With no
	// prefill node in the fleet every request is served whole.
	Disaggregate routing.DisaggMode
}

// DefaultConfig returns the first version's policy: longest-prefix with routing's defaults.
func DefaultConfig() Config {
	return Config{Policy: routing.PolicyLongestPrefix, PolicyConfig: routing.DefaultPolicyConfig()}
}

// Server is the gRPC Router service. It is safe for concurrent use.
type Server struct {
	pb.UnimplementedRouterServer

	view    *View
	dec     *routing.Decider
	tok     tokenizer.Tokenizer
	pins    PinTable
	ejected func(string) bool
	metrics *metrics
	pool    sync.Pool // *scratch
	tracer  trace.Tracer
	tracing bool          // cfg.TracerProvider records (trace.go)
	flow    flow.Admitter // nil: off
	disagg  routing.DisaggMode
}

type scratch struct {
	snap     Snapshot
	eligible []int
	nodes    []routing.NodeInfo
	choice   routing.Choice
	prefill  []int // the snapshot's prefill nodes the request may use
	pnodes   []routing.NodeInfo
}

var _ pb.RouterServer = (*Server)(nil)

// NewServer returns a Router service over view; its metrics go to reg (nil: none registered).
func NewServer(view *View, cfg Config, reg prometheus.Registerer) (*Server, error) {
	d := cfg.Decider
	if d == nil {
		idx, ok := view.index.(*routing.Index)
		if !ok {
			return nil, fmt.Errorf("router: a view over a %T needs Config.Decider", view.index)
		}
		p, err := routing.NewPolicy(cfg.Policy, cfg.PolicyConfig)
		if err != nil {
			return nil, fmt.Errorf("router: %w", err)
		}
		if d, err = routing.NewDecider(idx, routing.NewOverlay(0, 0), p, routing.DeciderConfig{}); err != nil {
			return nil, fmt.Errorf("router: %w", err)
		}
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("router: register metrics: %w", err)
	}
	s := &Server{view: view, dec: d, tok: cfg.Tokenizer, pins: cfg.Pins, metrics: m, flow: cfg.Flow, disagg: cfg.Disaggregate,
		tracer: spans.Tracer(cfg.TracerProvider, tracerName), tracing: spans.Enabled(cfg.TracerProvider)}
	if cfg.Ejector != nil {
		s.ejected = cfg.Ejector.Ejected
	}
	return s, nil
}

// Decider returns the server's decision path.
func (s *Server) Decider() *routing.Decider { return s.dec }

// Register adds the Router service to g.
func (s *Server) Register(g *grpc.Server) { pb.RegisterRouterServer(g, s) }

// Route implements Router.Route.
func (s *Server) Route(ctx context.Context, req *pb.RouteRequest) (*pb.RouteResponse, error) {
	start := time.Now()
	var span trace.Span
	if s.tracing {
		ctx, span = s.routeSpan(ctx)
	}
	resp, err := s.route(ctx, req, start)
	s.metrics.observe(resp, err, time.Since(start))
	if span != nil {
		endRouteSpan(span, req, err)
	}
	return resp, err
}

func (s *Server) route(ctx context.Context, req *pb.RouteRequest, now time.Time) (*pb.RouteResponse, error) {
	tokens := req.GetTokens()
	capErr := openai.CheckPromptTokens(len(tokens))
	switch {
	case len(tokens) > 0 && req.GetText() != "":
		return nil, status.Error(codes.InvalidArgument, "route: give tokens or text, not both")
	case capErr != nil:
		return nil, status.Errorf(codes.InvalidArgument, "route: tokens: %v", capErr)
	case len(tokens) == 0 && req.GetText() == "":
		return nil, status.Error(codes.InvalidArgument, "route: tokens or text is required")
	case len(tokens) == 0 && s.tok == nil:
		return nil, status.Error(codes.InvalidArgument, "route: text: this router has no tokenizer; send tokens")
	case len(tokens) == 0 && len(req.GetText()) > MaxTextBytes:
		return nil, status.Errorf(codes.InvalidArgument, "route: text: %d bytes (max %d)", len(req.GetText()), MaxTextBytes)
	}
	if s.flow != nil && !req.GetDryRun() {
		// Flow control at every door's point: the request is valid, not yet tokenised. The
		// router never sees the request itself, so it is released with the decision. A dry run
		// is a probe and is never queued.
		release, err := s.admitFlow(ctx, req.GetModel())
		if err != nil {
			return nil, err
		}
		defer release()
	}
	if len(tokens) == 0 {
		var err error
		tspan := s.tokenizeSpan(ctx)
		tokens, err = tokenizer.EncodePrompt(context.Background(), s.tok, req.GetText())
		tokenized(tspan, len(tokens), err)
		if err != nil {
			return nil, status.Errorf(codes.Unavailable, "route: tokenize the text: %v", err)
		}
		// Text under MaxTextBytes may still tokenise to more than the cap (a token per byte
		// in the worst case): the same check as the ids'.
		if err := openai.CheckPromptTokens(len(tokens)); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "route: text: %v", err)
		}
	}
	sc, _ := s.pool.Get().(*scratch)
	if sc == nil {
		sc = new(scratch)
	}
	defer s.pool.Put(sc)
	// decide spans listing the candidates, the admission wait and the decision.
	var decide trace.Span
	if s.tracing {
		_, decide = s.tracer.Start(ctx, spans.SpanDecide)
		defer decide.End()
	}
	if err := s.candidates(sc, req); err != nil {
		return nil, err
	}
	dr := routing.DecideRequest{Tokens: tokens, AdapterID: req.GetAdapterId(), Model: req.GetModel(),
		SessionKey: routing.SessionKey(req.GetSessionId())}
	if !req.GetDryRun() {
		// A burst's decisions take turns as the request service's do
		// (routing.Decider.AdmissionWait); the view is read again after the wait, so the
		// decision sees what arrived meanwhile.
		if w := s.dec.AdmissionWait(&dr, sc.nodes, now, &sc.choice); w > 0 {
			requests.WaitAdmission(ctx, w)
			now = time.Now()
			if err := s.candidates(sc, req); err != nil {
				return nil, err
			}
		}
	}
	// The client sends the request itself, so the router never sees it end: the decision is
	// recorded in the overlay for its TTL and shared, but not counted in flight. A dry run (a
	// probe, a what-if) records nothing, so asking does not change later answers.
	commit := routing.CommitRecord
	if req.GetDryRun() {
		commit = routing.CommitNone
	}
	c := &sc.choice
	sn := &sc.snap
	if err := s.dec.Decide(&dr, sc.nodes, now, commit, c); err != nil {
		switch {
		case errors.Is(err, routing.ErrNoCandidates):
			return nil, status.Error(codes.Unavailable, "route: no eligible node")
		case errors.Is(err, routing.ErrOverloaded):
			return nil, status.Error(codes.ResourceExhausted, "route: every eligible node is at its in-flight bound")
		}
		return nil, status.Errorf(codes.Internal, "route: %v", err)
	}
	chosen := sn.Meta[sc.eligible[c.Node]]
	resp := &pb.RouteResponse{
		NodeId:                 chosen.NodeID,
		GrpcAddress:            chosen.GRPCAddr,
		EngineUrl:              chosen.EngineURL,
		EstimatedMatchedTokens: int64(c.MatchedTokens),
		Reason:                 c.Reason,
		PromptTokens:           int64(len(tokens)),
	}
	if decide != nil && decide.IsRecording() {
		spans.Decision(decide, chosen.NodeID, s.dec.Policy().Name(), c.Reason, c.MatchedTokens,
			requests.ExpectedTTFT(&sc.nodes[c.Node], len(tokens)-c.MatchedTokens), len(tokens))
		decide.SetAttributes(spans.AttrDryRun.Bool(req.GetDryRun()))
	}
	s.planPrefill(sc, &dr, resp, now)
	for _, cd := range c.Candidates {
		score := cd.Score
		if math.IsNaN(score) {
			score = math.Inf(1)
		}
		resp.Candidates = append(resp.Candidates, &pb.RouteCandidate{
			NodeId:                 sc.nodes[cd.Node].ID,
			EstimatedMatchedTokens: int64(cd.MatchedTokens),
			Load:                   cd.Load,
			Score:                  score,
		})
	}
	return resp, nil
}

// candidates reads the view into sc and lists the nodes req may go to in sc.nodes (sc.eligible
// maps them back to the snapshot), or says why there are none.
func (s *Server) candidates(sc *scratch, req *pb.RouteRequest) error {
	s.view.Nodes(&sc.snap)
	sn := &sc.snap
	allowed, pinned := allowedFilter(s.pins, req.GetAdapterId())
	// The same eligibility as the request service's picker (routing.Eligibility): pins, ejections,
	// draining, model; the decider applies the in-flight cap and gives a cold node no affinity.
	el := routing.Eligibility{Model: req.GetModel(), Ejected: s.ejected}
	if allowed != nil {
		el.Allowed = allowed.Has
	}
	sc.eligible = routing.AppendEligible(sc.eligible[:0], sn.Nodes, &el)
	if len(sc.eligible) == 0 && allowed != nil {
		return status.Errorf(codes.Unavailable, "route: no eligible node (of %d synced) for model %q: adapter %d is pinned to %v",
			len(sn.Nodes), req.GetModel(), req.GetAdapterId(), pinned)
	}
	if len(sc.eligible) == 0 {
		return status.Errorf(codes.Unavailable, "route: no eligible node (of %d synced) for model %q", len(sn.Nodes), req.GetModel())
	}
	sc.nodes = sc.nodes[:0]
	for _, i := range sc.eligible {
		sc.nodes = append(sc.nodes, sn.Nodes[i])
	}
	// The prefill pool under the same rule (routing.Eligibility.Prefill).
	el.Prefill = true
	sc.prefill = routing.AppendEligible(sc.prefill[:0], sn.Nodes, &el)
	return nil
}

// planPrefill names in resp the prefill node the request's prefill should run on, if any
// (routing.Decider.PlanPrefill over the prefill pool), with the plan's reason. Route records
// only the decode decision: the client sends both legs itself.
func (s *Server) planPrefill(sc *scratch, dr *routing.DecideRequest, resp *pb.RouteResponse, now time.Time) {
	c := &sc.choice
	sc.pnodes = sc.pnodes[:0]
	for _, i := range sc.prefill {
		sc.pnodes = append(sc.pnodes, sc.snap.Nodes[i])
	}
	pf := s.dec.PlanPrefill(dr, &sc.nodes[c.Node], c, sc.pnodes, s.disagg, now, routing.CommitNone)
	resp.PrefillReason = pf.Plan.Reason
	if pf.Node < 0 {
		s.planPeerPull(sc, dr, resp)
		return
	}
	m := sc.snap.Meta[sc.prefill[pf.Node]]
	resp.PrefillNodeId, resp.PrefillGrpcAddress, resp.PrefillEngineUrl = m.NodeID, m.GRPCAddr, m.EngineURL
	resp.PrefillEstimatedMatchedTokens = int64(pf.MatchedTokens)
}

// planPeerPull names in resp the peer the chosen node should pull the prompt's cached prefix
// from (routing.Decider.PlanPeerPull), when that peer announces where its KV is pulled.
func (s *Server) planPeerPull(sc *scratch, dr *routing.DecideRequest, resp *pb.RouteResponse) {
	pp := s.dec.PlanPeerPull(dr, sc.nodes, &sc.choice)
	if pp.Source < 0 {
		return
	}
	m := sc.snap.Meta[sc.eligible[pp.Source]]
	if m.KVPeerAddr == "" {
		return
	}
	resp.KvSourceNodeId, resp.KvSourceAddress, resp.KvSourceTokens = m.NodeID, m.KVPeerAddr, int64(pp.Tokens)
	resp.EstimatedMatchedTokens = int64(pp.MatchedTokens)
}
