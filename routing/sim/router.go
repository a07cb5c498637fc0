package sim

import (
	"slices"
	"strconv"
	"time"

	"github.com/prefixmesh/prefixmesh/local"
	"github.com/prefixmesh/prefixmesh/routing"
)

// rview is one router's knowledge of one node.
type rview struct {
	rep       load // last load report received
	repairing bool
}

// router is one router replica: its own summary index (fed by every node's deltas, repaired on
// gaps), overlay, in-flight counts and view of the nodes' load, all behind the daemon's
// routing.Decider; with sharing, its decisions and load reach the other routers and theirs
// reach it.
type router struct {
	idx     int
	id      string
	index   *routing.Index
	dec     *routing.Decider
	views   []rview
	expired time.Duration // when the overlay was last expired
	repairs int           // full-summary pulls after a gap

	infos    []routing.NodeInfo
	dinfos   []routing.NodeInfo // decode candidates (routing.Eligibility): roles both and decode
	pinfos   []routing.NodeInfo // prefill candidates (Eligibility.Prefill)
	didx     []int              // fleet position of dinfos[i]
	pidx     []int              // fleet position of pinfos[i]
	choice   routing.Choice
	loads    []routing.NodeInFlight // scratch for load reports
	lastLoad []routing.NodeInFlight // the last load report sent
	lastSent time.Duration
	ttft     []routing.TTFTObservation // scratch for first-token packets
}

func newRouter(s *Sim, r int, p routing.Policy) (*router, error) {
	rt := &router{idx: r, id: "router-" + strconv.Itoa(r), index: routing.NewIndex(routing.DefaultIndexConfig()),
		views: make([]rview, len(s.nodes))}
	var hooks routing.DeciderHooks
	if s.sharing() {
		hooks.OnDecision = func(node string, hashes []uint64, indexed int, _ time.Time) {
			s.shareDecision(rt, node, hashes, indexed)
		}
	}
	d, err := routing.NewDecider(rt.index, routing.NewOverlay(s.cfg.OverlayTTL, s.cfg.OverlayMax), p, routing.DeciderConfig{AdmissionSlot: s.cfg.AdmissionSlot, Hooks: hooks, Spread: s.cfg.Spread, NoTTFTLearning: s.cfg.NoTTFTLearning})
	if err != nil {
		return nil, err
	}
	rt.dec = d
	if s.sharing() {
		d.SetRouterID(rt.id)
	}
	for i, n := range s.nodes {
		// At join the router knows each node is empty and idle, and its capacity (metadata).
		rt.index.ReplaceNode(n.id, n.epoch, 0, nil)
		rt.views[i].rep = n.load(0)
	}
	return rt, nil
}

// decision is a router's answer for one request: the node that decodes it (and, aggregated or
// prefilled locally, computes its prompt) and, disaggregated, its prefill node (-1: none).
type decision struct {
	node, prefill int
	choice        *routing.Choice
	plan          routing.Prefill
}

// route decides req through the router's Decider, exactly as the daemon does: the decode node
// among the decode-capable nodes (routing.Eligibility), each with the last load report it sent
// this router, aged; then, with prefill nodes, where the prefill runs (disaggregate).
func (rt *router) route(s *Sim, req *Request) (decision, error) {
	now := epoch0.Add(s.q.now)
	if s.q.now-rt.expired >= s.cfg.OverlayTTL/4 { // as the daemon does, every bucket width
		rt.dec.Expire(now)
		rt.expired = s.q.now
	}
	dr := routing.DecideRequest{Tokens: req.Tokens, SessionKey: req.SessionKey}
	rt.candidates(s)
	if err := rt.dec.Decide(&dr, rt.dinfos, now, routing.CommitBegin, &rt.choice); err != nil {
		return decision{}, err
	}
	d := decision{node: rt.didx[rt.choice.Node], prefill: -1, choice: &rt.choice}
	if len(rt.pinfos) > 0 {
		d.plan = rt.disaggregate(s, &dr, now)
		if d.plan.Node >= 0 {
			d.prefill = rt.pidx[d.plan.Node]
		}
	}
	if d.prefill < 0 {
		// Then, as the daemon's doors do without a remote prefill, the peer pull; the plan
		// travels with the request to its node (the enqueue that follows takes it).
		s.nodes[d.node].nextPull = rt.peerPull(s, &dr)
	}
	return d, nil
}

// disaggregate decides where the prefill of the request just decided runs. The router's own rule
// is routing.Decider.PlanPrefill over the prefill nodes (auto, always, never). A baseline is fed
// only what it uses — llm-d's the prompt and the decode node's GPU match; Dynamo's the decode
// node's match per tier, which it weighs with its own tier weights; both the prefill nodes'
// queued prefill tokens to pick the least loaded — and its choice is then committed through
// PlanPrefill with that one node and always, so the prefill leg is counted and learned from as
// the router's own are.
func (rt *router) disaggregate(s *Sim, dr *routing.DecideRequest, now time.Time) routing.Prefill {
	decode := &rt.dinfos[rt.choice.Node]
	switch s.cfg.Disaggregate {
	case DisaggLLMD, DisaggDynamo:
	default:
		return rt.dec.PlanPrefill(dr, decode, &rt.choice, rt.pinfos, s.cfg.Disaggregate.mode(), now, routing.CommitBegin)
	}
	for i := range rt.pinfos {
		p := &rt.pinfos[i]
		p.InFlightPrefillTokens = rt.dec.TotalInFlight(p.ID, now).PrefillTokens
	}
	in := routing.PrefillInput{PromptTokens: len(dr.Tokens), BlockSize: s.cfg.BlockSize, Decode: decode,
		DecodeMatch: rt.choice.Tiers, Prefill: rt.pinfos}
	var plan routing.PrefillPlan
	if s.cfg.Disaggregate == DisaggLLMD {
		plan = routing.PlanPrefillLLMD(&in, s.cfg.LLMDNonCachedTokens)
	} else {
		pc := &s.cfg.Policy
		var w [local.NumTiers]float64
		w[local.TierGPU], w[local.TierCPU] = 1, pc.DynamoHostCacheHitWeight
		w[local.TierDisk], w[local.TierStorage], w[local.TierRemote] = pc.DynamoDiskCacheHitWeight, pc.DynamoDiskCacheHitWeight, pc.DynamoSharedCacheMultiplier
		plan = routing.PlanPrefillDynamo(&in, w)
	}
	if plan.Prefill < 0 {
		return routing.Prefill{Plan: plan, Node: -1}
	}
	k := plan.Prefill
	pf := rt.dec.PlanPrefill(dr, decode, &rt.choice, rt.pinfos[k:k+1], routing.DisaggAlways, now, routing.CommitBegin)
	if pf.Node >= 0 {
		pf.Node = k
	}
	pf.Plan.Reason = plan.Reason
	return pf
}

// admissionWait is how long the router waits before deciding req, as the daemon's front door
// does (routing.Decider.AdmissionWait).
func (rt *router) admissionWait(s *Sim, req *Request) time.Duration {
	dr := routing.DecideRequest{Tokens: req.Tokens, SessionKey: req.SessionKey}
	rt.candidates(s)
	return rt.dec.AdmissionWait(&dr, rt.dinfos, epoch0.Add(s.q.now), &rt.choice)
}

// Who may take what, as every door of the router decides it.
var (
	decodeNodes  = routing.Eligibility{}
	prefillNodes = routing.Eligibility{Prefill: true}
)

// candidates lists every node with the last load report it sent this router, aged, and splits
// them into the decode candidates (dinfos) and the prefill candidates (pinfos).
func (rt *router) candidates(s *Sim) {
	rt.infos = rt.infos[:0]
	for i, n := range s.nodes {
		v := &rt.views[i]
		rt.infos = append(rt.infos, routing.NodeInfo{
			ID: n.id, Alive: true, Role: n.role,
			QueuedPrefillTokens: v.rep.queued, Running: v.rep.running, Waiting: v.rep.waiting,
			FreeBlocks: v.rep.freeBlocks, CapacityBlocks: v.rep.capacityBlock,
			LoadAge: s.q.now - v.rep.at, BlockSize: s.cfg.BlockSize,
		})
	}
	rt.didx = routing.AppendEligible(rt.didx[:0], rt.infos, &decodeNodes)
	rt.pidx = routing.AppendEligible(rt.pidx[:0], rt.infos, &prefillNodes)
	rt.dinfos, rt.pinfos = rt.dinfos[:0], rt.pinfos[:0]
	for _, i := range rt.didx {
		rt.dinfos = append(rt.dinfos, rt.infos[i])
	}
	for _, i := range rt.pidx {
		rt.pinfos = append(rt.pinfos, rt.infos[i])
	}
}

// deliverDelta applies a delta (or snapshot) at the router; a gap starts a repair.
func (rt *router) deliverDelta(s *Sim, mi int) {
	m := &s.msgs[mi]
	n := s.nodes[m.node]
	if m.full {
		rt.index.ReplaceNode(n.id, n.epoch, m.to, m.snapshot)
	} else if err := rt.index.ApplyDelta(n.id, n.epoch, m.from, m.to, m.changes); err != nil {
		rt.startRepair(s, m.node) // ErrGap: a delta was lost
	}
}

// deliverLoad installs a load report. The report also carries the node's summary head, so a
// router whose index is behind it with no delta left in flight (the last delta was lost: deltas
// travel ahead of the report that follows them) repairs without waiting for the next delta.
func (rt *router) deliverLoad(s *Sim, mi int) {
	m := &s.msgs[mi]
	v := &rt.views[m.node]
	if m.load.at >= v.rep.at {
		v.rep = m.load
	}
	if _, seq, _, _ := rt.index.NodeState(s.nodes[m.node].id); seq < m.load.head {
		rt.startRepair(s, m.node)
	}
}

// startRepair schedules a full-summary pull from node ni unless one is under way.
func (rt *router) startRepair(s *Sim, ni int) {
	if v := &rt.views[ni]; !v.repairing {
		v.repairing = true
		s.q.schedule(event{at: s.q.now + s.cfg.RepairDelay, kind: evRepair, router: rt.idx, node: ni})
	}
}

// repair pulls node ni's full summary (NodeCache.GetSummary) and installs it.
func (rt *router) repair(s *Sim, ni int) {
	n := s.nodes[ni]
	hashes, head := n.sum.snapshot(nil)
	rt.index.ReplaceNode(n.id, n.epoch, head, hashes)
	rt.views[ni].repairing = false
	rt.repairs++
}

// shareDecision sends a decision to every other router: the part of the chain beyond what the
// node's summary already reports at this router, in packets (routing.AppendShareChunks), each
// lost independently with ShareLoss.
func (s *Sim) shareDecision(rt *router, node string, hashes []uint64, indexed int) {
	ni := s.byID[node]
	s.chunks = routing.AppendShareChunks(s.chunks[:0], rt.id, node, indexed, len(hashes))
	for _, c := range s.chunks {
		size := int64(routing.ShareDecisionBytes(rt.id, node, c.From, c.To-c.From))
		m := s.newMessage(ni)
		msg := &s.msgs[m]
		msg.peer = rt.idx
		msg.hashes = append(msg.hashes[:0], hashes[c.From:c.To]...)
		msg.offset = c.From
		s.sendToPeers(rt, m, size, evShareDecision)
	}
}

// sendToPeers delivers message m of size bytes from rt to every other router after ShareDelay.
func (s *Sim) sendToPeers(rt *router, m int, size int64, kind eventKind) {
	for r := range s.routers {
		if r == rt.idx {
			continue
		}
		s.shareBytes += size
		s.shareMsgs++
		if s.cfg.ShareLoss > 0 && s.rng.Float64() < s.cfg.ShareLoss {
			s.shareLost++
			continue
		}
		s.msgs[m].refs++
		s.q.schedule(event{at: s.q.now + s.cfg.ShareDelay, kind: kind, router: r, msg: m})
	}
	if s.msgs[m].refs == 0 {
		s.freeMessage(m)
	}
}

// shareTick is a router's periodic load report: its own in-flight counts per node, sent when
// they changed since the last report or a second has passed.
func (rt *router) shareTick(s *Sim) {
	// Requests still queued are reported again every half TTL, as router/peershare does.
	rt.dec.RefreshPending(epoch0.Add(s.q.now), s.cfg.OverlayTTL/2)
	rt.loads = rt.dec.AppendOwnLoads(rt.loads[:0])
	s.parts = routing.AppendLoadParts(s.parts[:0], rt.id, rt.loads) // sorts rt.loads
	if !slices.Equal(rt.loads, rt.lastLoad) || s.q.now-rt.lastSent >= time.Second {
		rt.lastLoad = append(rt.lastLoad[:0], rt.loads...)
		rt.lastSent = s.q.now
		start := 0
		for p, end := range s.parts {
			m := s.newMessage(0)
			msg := &s.msgs[m]
			msg.peer, msg.part, msg.parts = rt.idx, p, len(s.parts)
			msg.loads = append(msg.loads[:0], rt.loads[start:end]...)
			s.sendToPeers(rt, m, int64(routing.ShareLoadBytes(rt.id, msg.loads)), evShareLoad)
			start = end
		}
	}
	// First tokens observed since the last tick, as router/peershare sends them.
	rt.ttft = rt.dec.AppendTTFTObservations(rt.ttft[:0])
	s.parts = routing.AppendTTFTParts(s.parts[:0], rt.id, rt.ttft)
	start := 0
	for _, end := range s.parts {
		m := s.newMessage(0)
		msg := &s.msgs[m]
		msg.peer = rt.idx
		msg.ttft = append(msg.ttft[:0], rt.ttft[start:end]...)
		s.sendToPeers(rt, m, int64(routing.ShareTTFTBytes(rt.id, msg.ttft)), evShareTTFT)
		start = end
	}
	if s.running() {
		s.q.schedule(event{at: s.q.now + s.cfg.ShareInterval, kind: evShareTick, router: rt.idx})
	}
}
