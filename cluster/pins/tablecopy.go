package pins

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	pb "github.com/prefixmesh/prefixmesh/proto/prefixmesh/v1"
)

// PinSource is a local, read-only view of the pin table with change signals: a *Store on a
// router, a *TableCopy on a node agent.
type PinSource interface {
	AllowedNodes(adapter uint64) (nodes []string, pinned bool)
	PrefixPinsFor(node string) []PrefixPin
	Subscribe() (<-chan struct{}, func())
}

var (
	_ PinSource = (*Store)(nil)
	_ PinSource = (*TableCopy)(nil)
)

// TableCopy keeps a read-only copy of the pin table from a router's Pins.Watch stream, for members
// that are not Raft voters (node agents). It re-subscribes with backoff when the stream breaks;
// every new stream starts with the full table, so nothing is missed.
type TableCopy struct {
	client    pb.PinsClient
	fsm       *FSM
	connected atomic.Bool
	resets    atomic.Uint64
}

// NewTableCopy returns an empty copy fed by client once Run is called.
func NewTableCopy(client pb.PinsClient) *TableCopy {
	return &TableCopy{client: client, fsm: NewFSM()}
}

// copy backoff bounds: retry quickly after a router restart, but never hammer a router that
// is down (5 s is well under how long an operator waits for a pin to take effect).
const (
	copyBackoffMin = 50 * time.Millisecond
	copyBackoffMax = 5 * time.Second
)

// Run follows the Watch stream until ctx ends (then it returns nil).
func (m *TableCopy) Run(ctx context.Context) error {
	backoff := copyBackoffMin
	for {
		err := m.follow(ctx)
		m.connected.Store(false)
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			backoff = copyBackoffMin
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		backoff = min(2*backoff, copyBackoffMax)
	}
}

// follow consumes one Watch stream.
func (m *TableCopy) follow(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := m.client.Watch(ctx, &pb.WatchPinsRequest{})
	if err != nil {
		return fmt.Errorf("watch pins: %w", err)
	}
	synced := false
	for {
		ev, err := stream.Recv()
		if err != nil {
			return fmt.Errorf("watch pins: %w", err)
		}
		if ev.GetReset_() {
			st, err := stateFromPB(ev.GetState(), ev.GetAppliedIndex())
			if err != nil {
				return err
			}
			m.fsm.replace(st)
			m.resets.Add(1)
			synced = true
			m.connected.Store(true)
		}
		if !synced {
			return errors.New("watch pins: stream did not start with the table")
		}
		changes := make([]Change, 0, len(ev.GetChanges()))
		for _, c := range ev.GetChanges() {
			ch, err := changeFromPB(c)
			if err != nil {
				return err
			}
			changes = append(changes, ch)
		}
		if len(changes) > 0 || !ev.GetReset_() {
			m.fsm.applyChanges(changes, ev.GetAppliedIndex())
		}
	}
}

// Connected reports whether the copy holds the table from a live stream.
func (m *TableCopy) Connected() bool { return m.connected.Load() }

// AppliedIndex returns the index the copied table reflects.
func (m *TableCopy) AppliedIndex() uint64 { return m.fsm.AppliedIndex() }

// AllowedNodes implements PinSource.
func (m *TableCopy) AllowedNodes(adapter uint64) ([]string, bool) { return m.fsm.AllowedNodes(adapter) }

// PrefixPinsFor implements PinSource.
func (m *TableCopy) PrefixPinsFor(node string) []PrefixPin { return m.fsm.PrefixPinsFor(node) }

// Subscribe implements PinSource.
func (m *TableCopy) Subscribe() (<-chan struct{}, func()) { return m.fsm.Subscribe() }

// View returns the copied table.
func (m *TableCopy) View() View { return m.fsm.View() }

// replace swaps in a whole table (a Watch reset).
func (f *FSM) replace(st state) {
	f.mu.Lock()
	f.st = st
	f.journal = nil
	f.floor = st.applied
	f.mu.Unlock()
	f.notify()
}

// applyChanges replays changes received from another member's journal.
func (f *FSM) applyChanges(changes []Change, applied uint64) {
	f.mu.Lock()
	st := &f.st
	for _, c := range changes {
		switch c.Kind {
		case ChangePutAdapter:
			st.adapters[c.Adapter.ID] = c.Adapter
		case ChangeDeleteAdapter:
			delete(st.adapters, c.Adapter.ID)
		case ChangePinAdapter:
			st.pins[c.Pin.AdapterID] = c.Pin
		case ChangeUnpinAdapter:
			delete(st.pins, c.Pin.AdapterID)
		case ChangePinPrefix:
			if old, ok := st.prefixes[c.Prefix.Key()]; ok {
				st.tokens -= len(old.Tokens)
			}
			st.prefixes[c.Prefix.Key()] = c.Prefix
			st.tokens += len(c.Prefix.Tokens)
		case ChangeUnpinPrefix:
			if old, ok := st.prefixes[c.Prefix.Key()]; ok {
				st.tokens -= len(old.Tokens)
				delete(st.prefixes, c.Prefix.Key())
			}
		}
		f.record(c)
	}
	if applied > st.applied {
		st.applied = applied
	}
	f.mu.Unlock()
	f.notify()
}

// stateFromPB builds a table from a List/Watch answer, validating every entry as a snapshot
// would be.
func stateFromPB(r *pb.ListPinsResponse, applied uint64) (state, error) {
	st := newState()
	st.applied = applied
	for _, a := range r.GetAdapters() {
		ad := adapterFromPB(a)
		if err := validateAdapter(ad); err != nil {
			return state{}, fmt.Errorf("watch pins: %w", err)
		}
		st.adapters[ad.ID] = ad
	}
	for _, p := range r.GetPins() {
		pin := AdapterPin{AdapterID: p.GetAdapterId(), Nodes: p.GetNodes(), Version: p.GetVersion()}
		if err := checkNodes(pin.Nodes); err != nil {
			return state{}, fmt.Errorf("watch pins: %w", err)
		}
		st.pins[pin.AdapterID] = pin
	}
	for _, p := range r.GetPrefixPins() {
		pp, err := prefixFromPB(p)
		if err != nil {
			return state{}, err
		}
		st.prefixes[pp.Key()] = pp
		st.tokens += len(pp.Tokens)
	}
	return st, nil
}

func adapterFromPB(a *pb.Adapter) Adapter {
	return Adapter{ID: a.GetId(), Name: a.GetName(), BaseModel: a.GetBaseModel(), Revision: a.GetRevision(), Version: a.GetVersion()}
}

// prefixFromPB converts and checks a prefix pin (the hash must be the tokens').
func prefixFromPB(p *pb.PrefixPin) (PrefixPin, error) {
	pp := PrefixPin{AdapterID: p.GetAdapterId(), Hash: p.GetPrefixHash(), Tokens: p.GetTokens(), Nodes: p.GetNodes(), Version: p.GetVersion()}
	if err := checkTokens(pp.Tokens); err != nil {
		return PrefixPin{}, fmt.Errorf("watch pins: %w", err)
	}
	if err := checkNodes(pp.Nodes); err != nil {
		return PrefixPin{}, fmt.Errorf("watch pins: %w", err)
	}
	if pp.Hash != PrefixHash(pp.AdapterID, pp.Tokens) {
		return PrefixPin{}, fmt.Errorf("watch pins: %w: prefix hash does not match its tokens", ErrCorrupt)
	}
	return pp, nil
}

// changeFromPB converts one change; removals carry only keys, so they are not validated further.
func changeFromPB(c *pb.PinChange) (Change, error) {
	ch := Change{Kind: ChangeKind(c.GetKind()), Index: c.GetIndex()}
	switch ch.Kind {
	case ChangePutAdapter, ChangeDeleteAdapter:
		ch.Adapter = adapterFromPB(c.GetAdapter())
	case ChangePinAdapter, ChangeUnpinAdapter:
		ch.Pin = AdapterPin{AdapterID: c.GetPin().GetAdapterId(), Nodes: c.GetPin().GetNodes(), Version: c.GetPin().GetVersion()}
		if ch.Kind == ChangePinAdapter {
			if err := checkNodes(ch.Pin.Nodes); err != nil {
				return Change{}, fmt.Errorf("watch pins: %w", err)
			}
		}
	case ChangePinPrefix:
		pp, err := prefixFromPB(c.GetPrefixPin())
		if err != nil {
			return Change{}, err
		}
		ch.Prefix = pp
	case ChangeUnpinPrefix:
		p := c.GetPrefixPin()
		ch.Prefix = PrefixPin{AdapterID: p.GetAdapterId(), Hash: p.GetPrefixHash(), Tokens: p.GetTokens()}
	default:
		return Change{}, fmt.Errorf("watch pins: %w: unknown change kind %d", ErrCorrupt, c.GetKind())
	}
	return ch, nil
}
