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

// ConnectorSource is a NodeSource that can say how a node's engine moves KV (MirrorNodes reads
// it from the node's gossiped metadata). A source without it is taken as NIXL everywhere.
type ConnectorSource interface {
	Connector(nodeID string) (conn cluster.KVConnector, bootstrapPort uint16)
}

// Connector implements ConnectorSource: a linear pass over the mirror, made only for a request
// that is disaggregated.
func (m MirrorNodes) Connector(nodeID string) (cluster.KVConnector, uint16) {
	st := m.M.Nodes()
	for i := range st {
		if st[i].Meta.NodeID == nodeID {
			return st[i].Meta.KVConnector, st[i].Meta.BootstrapPort
		}
	}
	return cluster.KVConnectorNone, 0
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
	if cs, ok := p.src.(ConnectorSource); ok {
		if conn, port := cs.Connector(leg.NodeID); conn != cluster.KVConnectorNone {
			leg.Connector, leg.BootstrapPort = conn, port
		}
	}
	leg.Done = func(o Outcome) { t.Done(p.now(), succeeded(o)) }
	leg.FirstToken = func() { t.FirstToken(p.now()) }
	leg.ObserveTransfer = func(d time.Duration) { p.dec.ObserveTransfer(transfer, d.Seconds()) }
	pk.Prefill = leg
}
