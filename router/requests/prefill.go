package requests

import (
	"time"

	"github.com/prefixmesh/prefixmesh/cluster"
	"github.com/prefixmesh/prefixmesh/routing"
)

// A disaggregated request (docs/disaggregation.md): the picker chooses the decode node as for any
// request, then routing.Decider.PlanPrefill decides whether the prompt's prefill runs on a
// prefill node first. The pick then carries the prefill leg; the door sends it (the front door)
// or names it to the gateway (the endpoint picker, llm-d's x-prefiller-host-port).

// PrefillLeg is where a disaggregated request's prefill runs and what the router learns from
// it. Done must be called exactly once; FirstToken at most once, when the prefill leg answered
// (its one token is its first); ObserveTransfer at most once, when the decode leg's first token
// came after the prefill leg's answer.
type PrefillLeg struct {
	NodeID    string
	EngineURL string
	// Connector is how the two engines move the KV (the prefill node's gossiped --kv-connector):
	// NIXL legs run one after the other, SGLang's at once; BootstrapPort is SGLang's.
	Connector     cluster.KVConnector
	BootstrapPort uint16
	// EstimatedMatchedTokens is the prefill node's estimate: what its cached_tokens will say,
	// and what the client is told (the decode engine reports every pulled token as cached).
	EstimatedMatchedTokens int
	// TransferTokens is the prompt's tokens the decode node lacks: what the transfer moves.
	TransferTokens  int
	Done            func(Outcome)
	FirstToken      func()
	ObserveTransfer func(time.Duration)
}

// NodeKV is how a node's engine exchanges KV with others, as it gossips it.
type NodeKV struct {
	// Connector is the engine's KV connector (--kv-connector); BootstrapPort is SGLang's.
	Connector     cluster.KVConnector
	BootstrapPort uint16
	// PeerAddr is where peers pull its KV (host:port), "" when it says nothing.
	PeerAddr string
}

// NodeKVSource is a NodeSource that can say how a node's engine exchanges KV (MirrorNodes reads
// it from the node's gossiped metadata). Without it every prefill node is taken as NIXL and no
// node can be a peer pull's source.
type NodeKVSource interface {
	NodeKV(nodeID string) (NodeKV, bool)
}

// NodeKV implements NodeKVSource: a linear pass over the mirror, made only for a request that is
// disaggregated or pulls.
func (m MirrorNodes) NodeKV(nodeID string) (NodeKV, bool) {
	st := m.M.Nodes()
	for i := range st {
		if mt := &st[i].Meta; mt.NodeID == nodeID {
			return NodeKV{Connector: mt.KVConnector, BootstrapPort: mt.BootstrapPort, PeerAddr: mt.KVPeerAddr}, true
		}
	}
	return NodeKV{}, false
}

// nodeKV is node's KV exchange as the source says, the zero NodeKV when it cannot.
func (p *PolicyPicker) nodeKV(node string) NodeKV {
	if ks, ok := p.src.(NodeKVSource); ok {
		kv, _ := ks.NodeKV(node)
		return kv
	}
	return NodeKV{}
}

// planPrefill lists the prefill pool under the decode pick's eligibility and, when it is not
// empty, lets the decider decide the prefill's node (committing its leg), filling pk.Prefill.
func (p *PolicyPicker) planPrefill(pk *Pick, dr *routing.DecideRequest, sc *pickScratch, el routing.Eligibility) {
	el.Prefill = true
	sc.pnodes, sc.purls = p.appendEligible(sc.pnodes[:0], sc.purls[:0], &el)
	if len(sc.pnodes) == 0 {
		return
	}
	c := &sc.choice
	pf := p.dec.PlanPrefill(dr, &sc.nodes[c.Node], c, sc.pnodes, p.disagg, p.now(), routing.CommitBegin)
	pk.PrefillReason = pf.Plan.Reason
	if pf.Node < 0 {
		return
	}
	t := pf.Ticket
	transfer := max(0, len(dr.Tokens)-c.MatchedTokens)
	leg := &PrefillLeg{
		NodeID: sc.pnodes[pf.Node].ID, EngineURL: sc.purls[pf.Node],
		EstimatedMatchedTokens: pf.MatchedTokens, TransferTokens: transfer,
		Connector: cluster.KVConnectorNIXL,
	}
	if kv := p.nodeKV(leg.NodeID); kv.Connector != cluster.KVConnectorNone {
		leg.Connector, leg.BootstrapPort = kv.Connector, kv.BootstrapPort
	}
	leg.Done = func(o Outcome) { t.Done(p.now(), succeeded(o)) }
	leg.FirstToken = func() { t.FirstToken(p.now()) }
	plan := pf.Plan
	leg.ObserveTransfer = func(d time.Duration) { p.dec.ObserveTransfer(&plan, d.Seconds()) }
	pk.Prefill = leg
}

// PeerSource is the peer a request's node pulls the prompt's cached prefix from instead of
// recomputing it (routing.Decider.PlanPeerPull): the front door names it in the request's
// kv_transfer_params.remote_kv_source, the endpoint picker in x-kv-cache-source-host-port.
type PeerSource struct {
	NodeID string
	// Addr is where the source's KV is pulled (host:port, its gossiped KVPeerAddr).
	Addr string
	// Tokens is how many prompt tokens the pull brings; MatchedTokens what the serving node
	// will then report cached (its own run and the pull).
	Tokens, MatchedTokens int
}

// planPeerPull lets the decider decide whether the chosen node pulls the prompt's prefix from a
// peer that holds more of it, filling pk.PeerSource when it does and the peer says where.
func (p *PolicyPicker) planPeerPull(pk *Pick, dr *routing.DecideRequest, sc *pickScratch) {
	pp := p.dec.PlanPeerPull(dr, sc.nodes, &sc.choice)
	if pp.Source < 0 {
		return
	}
	src := sc.nodes[pp.Source].ID
	addr := p.nodeKV(src).PeerAddr
	if addr == "" {
		return // the holder names no KV endpoint: the node recomputes (its ticket was told otherwise)
	}
	pk.PeerSource = &PeerSource{NodeID: src, Addr: addr, Tokens: pp.Tokens, MatchedTokens: pp.MatchedTokens}
	pk.EstimatedMatchedTokens = pp.MatchedTokens
}
