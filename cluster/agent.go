package cluster

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// Deps are an agent's collaborators. A node agent needs Source (and usually Load); a router
// agent needs Index and Fetcher.
type Deps struct {
	Source  Source
	Load    LoadFunc
	Index   Index
	Fetcher Fetcher
}

// Agent is one cluster member: a node agent publishing its summary and load, or a router
// mirroring every node's. New builds it, Start joins the cluster and starts its goroutines,
// Close leaves and joins them.
//
// Why load travels in direct state packets rather than metadata updates (UpdateNode) or gossip
// broadcasts: only routers read it, and both alternatives send every change to every member
// (an alive message with a bumped incarnation, or a broadcast retransmitted log N times), which
// at 5 changes/s per node is O(N²) traffic for information N−R members discard. A best-effort
// packet to each router costs O(R) per change. Summary deltas go the same way for the same
// reason; the loss of a packet is caught by the sequence check and the state heartbeat.
type Agent struct {
	cfg     Config
	deps    Deps
	metrics *metrics
	meta    atomic.Pointer[[]byte] // encoded Meta, served by NodeMeta
	metaMu  sync.Mutex             // serializes the read-modify-write of meta (updateMeta)
	epoch   atomic.Uint64          // Meta.Epoch, stamped on every delta, state and push/pull entry
	routers atomic.Pointer[[]memberlist.Node]

	ml  *memberlist.Memberlist
	pub *publisher     // node role
	mir *SummaryMirror // router role

	share atomic.Pointer[func([]byte)] // receiver of router-to-router share packets (sharewire.go)

	// recvHook, set by tests before Start, sees every received packet and returns the packets to
	// deliver now (none to drop it, several to release held ones).
	recvHook func(b []byte) [][]byte

	// knownMu guards known. It is not mu: memberlist calls the event delegate from Create,
	// which Start calls holding mu.
	knownMu sync.Mutex
	known   map[string]knownMember

	everJoined  atomic.Bool            // this member has known another one
	lastJoinErr atomic.Pointer[string] // the last failed join's error, for Health

	mu      sync.Mutex // guards started, closed
	started bool
	closed  bool

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// New validates cfg and builds an agent; it starts nothing.
func New(cfg Config, deps Deps) (*Agent, error) {
	if cfg.Meta.Epoch == 0 {
		var b [8]byte
		for binary.LittleEndian.Uint64(b[:]) == 0 {
			if _, err := rand.Read(b[:]); err != nil {
				return nil, fmt.Errorf("cluster: epoch: %w", err)
			}
		}
		cfg.Meta.Epoch = binary.LittleEndian.Uint64(b[:])
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	switch cfg.Meta.Role {
	case RoleNode:
		if deps.Source == nil {
			return nil, fmt.Errorf("cluster: %w: a node agent needs a summary source", ErrInvalid)
		}
	case RoleRouter:
		if deps.Index == nil || deps.Fetcher == nil {
			return nil, fmt.Errorf("cluster: %w: a router agent needs an index and a fetcher", ErrInvalid)
		}
	}
	m, err := newMetrics(cfg.Registry)
	if err != nil {
		return nil, fmt.Errorf("cluster: register metrics: %w", err)
	}
	a := &Agent{cfg: cfg, deps: deps, metrics: m, known: make(map[string]knownMember)}
	if err := a.setMeta(cfg.Meta); err != nil {
		return nil, err
	}
	a.epoch.Store(cfg.Meta.Epoch)
	a.routers.Store(&[]memberlist.Node{})
	switch cfg.Meta.Role {
	case RoleNode:
		a.pub = newPublisher(&a.cfg, &a.epoch, deps.Source, deps.Load, a.sendToRouters, m)
	case RoleRouter:
		a.mir = newSummaryMirror(&a.cfg, deps.Index, deps.Fetcher, m, a.Members)
		if err := registerIndexGauges(cfg.Registry, deps.Index); err != nil {
			return nil, fmt.Errorf("cluster: register index metrics: %w", err)
		}
	}
	return a, nil
}

func (a *Agent) setMeta(m Meta) error {
	b, err := m.MarshalBinary()
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	a.meta.Store(&b)
	return nil
}

// Meta returns the member's metadata (with its epoch).
func (a *Agent) Meta() Meta {
	var m Meta
	_ = m.UnmarshalBinary(*a.meta.Load())
	return m
}

// Mirror returns the router's mirror, or nil for a node agent.
func (a *Agent) Mirror() *SummaryMirror { return a.mir }

// Start binds the gossip port, starts the agent's goroutines and joins the seeds in the
// background (retrying while this member knows no other). It does not block on the network.
func (a *Agent) Start(ctx context.Context) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return ErrClosed
	}
	if a.started {
		return errors.New("cluster: agent already started")
	}
	mc, err := a.cfg.memberlistConfig()
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	mc.Logger = newMemberlistLogger(a.cfg.Logger, a.metrics) // counted and rate-limited
	mc.Delegate = delegate{a}
	mc.Events = events{a}
	ml, err := memberlist.Create(mc)
	if err != nil {
		return fmt.Errorf("cluster: start memberlist: %w", err)
	}
	a.ml = ml
	a.started = true
	ctx, a.cancel = context.WithCancel(context.WithoutCancel(ctx))
	if a.pub != nil {
		a.wg.Go(func() { a.pub.run(ctx) })
	}
	if a.mir != nil {
		a.wg.Go(func() { a.mir.run(ctx) })
	}
	if len(a.cfg.Join) > 0 {
		a.wg.Go(func() { a.joinLoop(ctx) })
	}
	return nil
}

// GossipAddr is the address other members reach this one at (host:port), valid after Start.
func (a *Agent) GossipAddr() string {
	n := a.ml.LocalNode()
	return net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))
}

// Join contacts seeds (resolved as Config.Join entries; a seed without a port uses this
// member's port, or memberlist's 7946 when that was chosen by the OS) and reports how many were
// reached. ctx bounds name resolution; each contact is bounded by memberlist's TCP timeout.
func (a *Agent) Join(ctx context.Context, seeds []string) (int, error) {
	port := a.cfg.BindPort
	if port == 0 {
		port = DefaultConfig(RoleNode, "x").BindPort
	}
	addrs, rerr := resolveSeeds(ctx, net.DefaultResolver, seeds, port)
	if len(addrs) == 0 {
		return 0, fmt.Errorf("cluster: join: %w", rerr)
	}
	n, err := a.ml.Join(addrs)
	if err != nil && n == 0 {
		return 0, fmt.Errorf("cluster: join %v: %w", addrs, err)
	}
	return n, nil
}

// joinLoop joins the configured seeds, and again whenever this member is alone. Failures are
// logged at WARN with a growing gap (joinLogger), the rest at DEBUG, and counted.
func (a *Agent) joinLoop(ctx context.Context) {
	t := time.NewTicker(a.cfg.JoinRetryInterval)
	defer t.Stop()
	var jl joinLogger
	for {
		if a.ml.NumMembers() <= 1 {
			if a.everJoined.Load() && jl.failures == 0 {
				a.cfg.Logger.Warn("lost every gossip peer; rejoining", "seeds", a.cfg.Join)
			}
			if n, err := a.Join(ctx, a.cfg.Join); err != nil {
				a.metrics.joinFailures.Inc()
				msg := strings.Join(strings.Fields(err.Error()), " ") // memberlist's errors span lines
				a.lastJoinErr.Store(&msg)
				level := slog.LevelDebug
				if jl.warn(time.Now(), a.cfg.JoinRetryInterval) {
					level = slog.LevelWarn
				}
				a.cfg.Logger.Log(ctx, level, "gossip join failed; this member is isolated and reports not serving",
					"seeds", a.cfg.Join, "attempts", jl.failures, "err", err)
			} else {
				jl.reset()
				a.cfg.Logger.Info("joined gossip cluster", "contacted", n, "members", a.ml.NumMembers())
			}
		} else {
			jl.reset()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Members returns the metadata of every live member, from the copies the event delegate made
// (memberlist's own Node structs change under its lock and must not be read outside it).
func (a *Agent) Members() []Meta {
	a.knownMu.Lock()
	defer a.knownMu.Unlock()
	out := make([]Meta, 0, len(a.known))
	for _, k := range a.known {
		out = append(out, k.meta)
	}
	return out
}

// SetDraining updates the draining flag in this member's metadata and gossips it.
func (a *Agent) SetDraining(draining bool) error {
	return a.updateMeta(func(m *Meta) { m.Draining = draining })
}

// SetCold updates the cold flag in this node's metadata (Meta.Cold: its summary may
// over-estimate its engine's cache) and gossips it.
func (a *Agent) SetCold(cold bool) error {
	return a.updateMeta(func(m *Meta) { m.Cold = cold })
}

// SetEpoch moves this node to a new epoch: its cache was replaced by an empty one (a mirrored
// engine restarted). From the call on, deltas, states and push/pull entries carry the new epoch
// and the metadata gossips it; a router that sees it drops everything it knew about the old
// epoch at once and repairs with GetSummary (docs/architecture.md, "One cache change"), so the node's NodeCache server must
// already answer with the same epoch, and its summary must no longer hold the old cache's blocks.
func (a *Agent) SetEpoch(epoch uint64) error {
	if epoch == 0 {
		return fmt.Errorf("cluster: %w: epoch 0", ErrInvalid)
	}
	return a.updateMeta(func(m *Meta) {
		m.Epoch = epoch
		a.epoch.Store(epoch)
	})
}

// updateMeta applies change to this member's metadata and, once started, gossips the result
// (waiting at most LeaveTimeout for the broadcast). Safe for concurrent use.
func (a *Agent) updateMeta(change func(*Meta)) error {
	a.metaMu.Lock()
	defer a.metaMu.Unlock()
	m := a.Meta()
	change(&m)
	if err := a.setMeta(m); err != nil {
		return err
	}
	a.mu.Lock()
	ml, live := a.ml, a.started && !a.closed
	a.mu.Unlock()
	if !live {
		return nil // Start publishes the metadata as it is then
	}
	return ml.UpdateNode(a.cfg.LeaveTimeout)
}

// Close stops publishing, leaves the cluster (bounded by LeaveTimeout and ctx), stops the
// goroutines and shuts memberlist down. It is safe to call more than once.
func (a *Agent) Close(ctx context.Context) error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil
	}
	a.closed = true
	started := a.started
	a.mu.Unlock()
	if !started {
		return nil
	}
	timeout := a.cfg.LeaveTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(dl))
	}
	a.cancel()
	a.wg.Wait()
	var errs []error
	if err := a.ml.Leave(max(timeout, time.Millisecond)); err != nil {
		errs = append(errs, fmt.Errorf("cluster: leave: %w", err))
	}
	if err := a.ml.Shutdown(); err != nil {
		errs = append(errs, fmt.Errorf("cluster: shutdown: %w", err))
	}
	return errors.Join(errs...)
}

// sendToRouters sends b best effort to every router member (memberlist copies b).
func (a *Agent) sendToRouters(b []byte) {
	if a.ml == nil {
		return
	}
	for _, r := range *a.routers.Load() {
		if err := a.ml.SendBestEffort(&r, b); err != nil {
			a.metrics.sendErrors.Inc()
			continue
		}
		a.metrics.sent(b[0], len(b))
	}
}

// memberChanged records a join, update or leave of n (called from memberlist's event
// delegate, so it only updates small maps and signals).
func (a *Agent) memberChanged(n *memberlist.Node, alive bool) {
	var m Meta
	if err := m.UnmarshalBinary(n.Meta); err != nil {
		a.metrics.drop("bad_meta")
		return
	}
	a.knownMu.Lock()
	if alive {
		a.known[n.Name] = knownMember{
			node: memberlist.Node{Name: n.Name, Addr: append(net.IP(nil), n.Addr...), Port: n.Port},
			meta: m,
		}
	} else {
		delete(a.known, n.Name)
	}
	routers := make([]memberlist.Node, 0, len(*a.routers.Load())+1)
	var byRole [3]int
	for _, k := range a.known {
		if int(k.meta.Role) < len(byRole) {
			byRole[k.meta.Role]++
		}
		if k.meta.Role == RoleRouter && k.node.Name != a.cfg.Meta.NodeID {
			routers = append(routers, k.node)
		}
	}
	a.routers.Store(&routers)
	if len(a.known) > 1 {
		a.everJoined.Store(true)
	}
	a.metrics.members.WithLabelValues("node").Set(float64(byRole[RoleNode]))
	a.metrics.members.WithLabelValues("router").Set(float64(byRole[RoleRouter]))
	a.metrics.isolated.Set(b2f(len(a.cfg.Join) > 0 && len(a.known) <= 1))
	a.knownMu.Unlock()
	if a.mir != nil {
		a.mir.membershipChanged()
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// received handles a user message or remote state from memberlist: copy, then hand off.
func (a *Agent) received(b []byte) {
	if len(b) > 0 && b[0] == msgShare {
		a.receivedShare(append([]byte(nil), b...))
		return
	}
	if a.mir == nil {
		return // node agents consume no summaries
	}
	c := append([]byte(nil), b...)
	if a.recvHook == nil {
		a.mir.deliver(c)
		return
	}
	for _, p := range a.recvHook(c) {
		a.mir.deliver(p)
	}
}

// localState is the push/pull version vector.
func (a *Agent) localState() []byte {
	v := Vector{Role: a.cfg.Meta.Role, From: a.cfg.Meta.NodeID}
	if a.pub != nil {
		seq, sum := a.pub.version()
		v.Entries = []VersionEntry{{NodeID: a.cfg.Meta.NodeID, Epoch: a.epoch.Load(), Seq: seq, Checksum: sum}}
	} else {
		v.Entries = a.mir.vector()
	}
	b, err := v.AppendBinary(nil)
	if err != nil {
		a.cfg.Logger.Error("encode push/pull state", "err", err)
		return nil
	}
	a.metrics.sent(msgPush, len(b))
	return b
}

// knownMember is a copy of what the send path needs about a member; memberlist's own Node
// structs change under its lock and must not be read outside a callback.
type knownMember struct {
	node memberlist.Node
	meta Meta
}

// delegate implements memberlist.Delegate; no method blocks.
type delegate struct{ a *Agent }

var _ memberlist.Delegate = delegate{}

func (d delegate) NodeMeta(limit int) []byte {
	b := *d.a.meta.Load()
	if len(b) > limit {
		return nil // cannot happen: Validate checked MaxMetaBytes
	}
	return b
}
func (d delegate) NotifyMsg(b []byte)                         { d.a.received(b) }
func (d delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (d delegate) LocalState(join bool) []byte                { return d.a.localState() }
func (d delegate) MergeRemoteState(buf []byte, join bool) {
	if len(buf) > 0 {
		d.a.received(buf)
	}
}

// events implements memberlist.EventDelegate.
type events struct{ a *Agent }

var _ memberlist.EventDelegate = events{}

func (e events) NotifyJoin(n *memberlist.Node)   { e.a.memberChanged(n, true) }
func (e events) NotifyLeave(n *memberlist.Node)  { e.a.memberChanged(n, false) }
func (e events) NotifyUpdate(n *memberlist.Node) { e.a.memberChanged(n, true) }
