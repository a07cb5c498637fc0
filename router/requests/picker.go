package requests

import (
	"context"
	"time"

	"github.com/prefixmesh/prefixmesh/routing"
)

// Picker chooses the node that serves a request. The router's view of the cluster implements it
// (PolicyPicker does, over any NodeSource). Implementations are safe for concurrent use.
type Picker interface {
	// Pick chooses a node for req, never one whose id is in exclude (the few nodes the request
	// already tried) nor, when req.Allowed is set, one outside it. It returns ErrNoNodes when
	// no node can serve the request (none alive, none serving the model, none allowed, all
	// excluded or ejected) and ErrOverloaded when every candidate is over its load bound. The caller must
	// call the returned Pick's Done exactly once.
	Pick(ctx context.Context, req *PickRequest, exclude []string) (Pick, error)
	// Models returns the union of the models the nodes serve, sorted.
	Models() []string
}

// PickRequest is what routing needs to know about a request.
type PickRequest struct {
	Tokens     []uint32 // the prompt's token ids, as the engine will see them; not kept after Pick returns
	AdapterID  uint64   // 0 = base model
	Model      string   // the base model ("" = any node)
	SessionKey uint64   // 0 = none
	// Alternates asks for up to this many next-best nodes in Pick.Alternates (a gateway's
	// fallback list); 0, the front door's case, asks for none and allocates nothing.
	Alternates int
	// Allowed, when not nil, is the only nodes the pick may choose: an adapter's placement pins
	// (router.PinnedPicker), a gateway's subset hint, or both intersected. A set, tested once per
	// node in O(1) (routing.Eligibility.Allowed), so that a request allowed few of many nodes
	// costs a pass over the nodes, not an exclusion list scanned per node.
	Allowed *routing.NodeSet
	// Disaggregable says the door can carry a disaggregated request (a prefill leg on a prefill
	// node, Pick.Prefill) or a peer pull (Pick.PeerSource): the front door's single prompts and
	// the endpoint picker's requests.
	Disaggregable bool
}

// Pick is a routing decision. Done must be called exactly once, when the request has ended (it
// lets the view decrement its in-flight count and record the outcome); FirstToken, when not nil,
// is called at most once, when the first output token reached the client (the request's prefill
// is over).
type Pick struct {
	NodeID                 string
	EngineURL              string // scheme://host:port of the node's OpenAI-compatible engine
	EstimatedMatchedTokens int
	// EstimatedTiers splits the estimate by tier: the GPU prefix and what the node's lower tiers
	// (CPU, disk, a shared store) add to it, before the engine's last-token rule.
	EstimatedTiers routing.TierTokens
	Policy         string
	Reason         string
	// ExpectedTTFT is the node's expected time to first token for this request (ExpectedTTFT);
	// the front door derives its first-byte deadline from it (0: its FirstByteFloor).
	ExpectedTTFT time.Duration
	// Alternates are the engine URLs of the next-best candidates, best first, when
	// PickRequest.Alternates asked for them: nothing is committed on them (a gateway retries on
	// them on its own; the in-flight count stays on NodeID).
	Alternates []string
	Done       func(Outcome)
	FirstToken func()
	// Reroute, when not nil (a pick with Alternates from a picker that can move it), moves the
	// request to the node with id node, which served it instead (a gateway's fallback), before
	// its first token: NodeID's count is given back as failed and node's begins, so Done and
	// FirstToken act on node from then on. moved is false when the picker does not know node
	// (nothing changed then); estimate is node's estimated matched tokens at the decision, -1
	// when it was not an alternate.
	Reroute func(node string) (estimate int, moved bool)
	// Prefill, when not nil, is the request's prefill leg on a prefill node (prefill.go); the
	// request itself goes to NodeID, its decode node.
	Prefill *PrefillLeg
	// PrefillReason is the disaggregation decision's reason when one was made ("" when the
	// request could not be disaggregated or no prefill node was eligible).
	PrefillReason string
	// PeerSource, when not nil, is the peer NodeID pulls the prompt's prefix from (prefill.go).
	PeerSource *PeerSource
}

// Outcome is how a routed request ended.
type Outcome struct {
	Status       int           // HTTP status relayed to the client (0: the upstream was not reached)
	Err          error         // transport error, nil when the upstream answered
	CachedTokens int           // the engine's cached_tokens, -1 when it did not say
	TTFT         time.Duration // to the first output token (streams) or the response (otherwise)
	Latency      time.Duration
}

// NodeTarget is one node as a NodeSource reports it: the routing view plus where its engine is.
type NodeTarget struct {
	Info      routing.NodeInfo
	EngineURL string
}

// NodeSource lists the nodes the router knows. The gossip view implements it; tests use a fixed
// list. Nodes is called once per decision and must be cheap; callers do not modify the slice.
type NodeSource interface {
	Nodes() []NodeTarget
}

// NodeAppender is a NodeSource that can append the nodes el admits, and their engine URLs,
// straight into a decision's scratch: the gossip view builds each node's entry per call, and a
// decision that lists them this way allocates and copies nothing more for them (MirrorNodes
// implements it).
type NodeAppender interface {
	AppendEligible(infos []routing.NodeInfo, urls []string, el routing.Eligibility) ([]routing.NodeInfo, []string)
}

// Ejector reports whether passive health has taken a node out of routing (Health implements it).
type Ejector interface {
	Ejected(nodeID string) bool
}

// HealthReporter receives the outcome of every attempt to reach a node (Health implements it).
type HealthReporter interface {
	ReportFailure(nodeID string)
	ReportSuccess(nodeID string)
}
