package pins

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"
)

// ChangeKind says what a Change did.
type ChangeKind uint8

// Change kinds (the values match proto PinChange.Kind).
const (
	ChangePutAdapter    ChangeKind = 1
	ChangeDeleteAdapter ChangeKind = 2
	ChangePinAdapter    ChangeKind = 3
	ChangeUnpinAdapter  ChangeKind = 4
	ChangePinPrefix     ChangeKind = 5
	ChangeUnpinPrefix   ChangeKind = 6
)

// Change is one effect of an applied command, in log order. Delete/unpin changes carry the
// removed entry.
type Change struct {
	Kind    ChangeKind
	Index   uint64
	Adapter Adapter
	Pin     AdapterPin
	Prefix  PrefixPin
}

// journalCap bounds the change journal: a watcher more than this many changes behind gets a full
// table instead (Watch streams are the only readers; pins change rarely, so 4096 covers minutes
// of a bulk import).
const journalCap = 4096

// state is the whole table. Values are never mutated in place after insertion (slices included),
// so a shallow copy of the maps is an immutable snapshot.
type state struct {
	applied  uint64 // index of the last applied entry
	adapters map[uint64]Adapter
	pins     map[uint64]AdapterPin
	prefixes map[PrefixKey]PrefixPin
	servers  map[string]string // raft server id → gRPC address
	tokens   int               // total tokens over prefixes
}

func newState() state {
	return state{
		adapters: map[uint64]Adapter{},
		pins:     map[uint64]AdapterPin{},
		prefixes: map[PrefixKey]PrefixPin{},
		servers:  map[string]string{},
	}
}

func (s *state) clone() state {
	c := *s
	c.adapters = maps.Clone(s.adapters)
	c.pins = maps.Clone(s.pins)
	c.prefixes = maps.Clone(s.prefixes)
	c.servers = maps.Clone(s.servers)
	return c
}

// FSM is the pin table's raft.FSM. Reads are safe from any goroutine.
type FSM struct {
	mu      sync.RWMutex // guards st, journal, floor
	st      state
	journal []Change // the last journalCap changes, oldest first
	floor   uint64   // every change with Index > floor is in journal

	restores atomic.Uint64 // snapshot restores, for tests and stats

	subMu sync.Mutex // guards subs, nextSub
	subs  map[int]chan struct{}
	next  int
}

var _ raft.FSM = (*FSM)(nil)

// NewFSM returns an empty table.
func NewFSM() *FSM {
	return &FSM{st: newState(), subs: map[int]chan struct{}{}}
}

// Apply implements raft.FSM. It returns a Result. Its outcome depends only on the entry and the
// current state: no clock, no map order (cascades are sorted).
func (f *FSM) Apply(l *raft.Log) any {
	if l.Type != raft.LogCommand {
		return Result{Index: l.Index}
	}
	c, err := DecodeCommand(l.Data)
	f.mu.Lock()
	var r Result
	if err != nil {
		r = Result{Index: l.Index, Err: err}
	} else {
		r = f.apply(l.Index, &c)
	}
	if l.Index > f.st.applied {
		f.st.applied = l.Index
	}
	f.mu.Unlock()
	f.notify()
	return r
}

// check evaluates a compare-and-set condition against the current version (0: absent).
func check(c Cond, current uint64) error {
	if c.Set && c.Version != current {
		return &VersionError{Expected: c.Version, Current: current}
	}
	return nil
}

// apply runs a decoded command at index idx. Callers hold f.mu.
func (f *FSM) apply(idx uint64, c *Command) Result {
	st := &f.st
	r := Result{Index: idx}
	switch c.Op {
	case OpPutAdapter:
		cur, ok := st.adapters[c.Adapter.ID]
		if r.Err = check(c.Cond, cur.Version); r.Err != nil {
			return r
		}
		if !ok && len(st.adapters) >= MaxAdapters {
			r.Err = fmt.Errorf("%w: %d adapters", ErrLimit, MaxAdapters)
			return r
		}
		a := c.Adapter
		a.Version = idx
		st.adapters[a.ID] = a
		f.record(Change{Kind: ChangePutAdapter, Index: idx, Adapter: a})
		r.Version = idx
	case OpDeleteAdapter:
		cur, ok := st.adapters[c.AdapterID]
		if r.Err = check(c.Cond, cur.Version); r.Err != nil {
			return r
		}
		if !ok {
			r.Err = fmt.Errorf("%w: adapter %d", ErrNotFound, c.AdapterID)
			return r
		}
		if p, ok := st.pins[c.AdapterID]; ok {
			delete(st.pins, c.AdapterID)
			f.record(Change{Kind: ChangeUnpinAdapter, Index: idx, Pin: p})
		}
		var gone []PrefixPin
		for k, p := range st.prefixes {
			if k.AdapterID == c.AdapterID {
				gone = append(gone, p)
			}
		}
		slices.SortFunc(gone, func(a, b PrefixPin) int { return cmp.Compare(a.Hash, b.Hash) })
		for _, p := range gone {
			delete(st.prefixes, p.Key())
			st.tokens -= len(p.Tokens)
			f.record(Change{Kind: ChangeUnpinPrefix, Index: idx, Prefix: p})
		}
		delete(st.adapters, c.AdapterID)
		f.record(Change{Kind: ChangeDeleteAdapter, Index: idx, Adapter: cur})
	case OpPinAdapter:
		if _, ok := st.adapters[c.AdapterID]; !ok {
			r.Err = fmt.Errorf("%w: adapter %d", ErrNotFound, c.AdapterID)
			return r
		}
		cur := st.pins[c.AdapterID]
		if r.Err = check(c.Cond, cur.Version); r.Err != nil {
			return r
		}
		p := AdapterPin{AdapterID: c.AdapterID, Nodes: c.Nodes, Version: idx}
		st.pins[c.AdapterID] = p
		f.record(Change{Kind: ChangePinAdapter, Index: idx, Pin: p})
		r.Version = idx
	case OpUnpinAdapter:
		cur, ok := st.pins[c.AdapterID]
		if r.Err = check(c.Cond, cur.Version); r.Err != nil {
			return r
		}
		if !ok {
			r.Err = fmt.Errorf("%w: adapter %d is not pinned", ErrNotFound, c.AdapterID)
			return r
		}
		delete(st.pins, c.AdapterID)
		f.record(Change{Kind: ChangeUnpinAdapter, Index: idx, Pin: cur})
	case OpPinPrefix:
		if _, ok := st.adapters[c.AdapterID]; !ok {
			r.Err = fmt.Errorf("%w: adapter %d", ErrNotFound, c.AdapterID)
			return r
		}
		k := PrefixKey{c.AdapterID, c.PrefixHash}
		cur, ok := st.prefixes[k]
		if ok && !slices.Equal(cur.Tokens, c.Tokens) {
			r.Err = fmt.Errorf("%w: prefix hash %016x collides with another pinned prefix", ErrInvalid, c.PrefixHash)
			return r
		}
		if r.Err = check(c.Cond, cur.Version); r.Err != nil {
			return r
		}
		if !ok && (len(st.prefixes) >= MaxPrefixPins || st.tokens+len(c.Tokens) > MaxTotalPrefixTokens) {
			r.Err = fmt.Errorf("%w: %d prefix pins or %d pinned tokens", ErrLimit, MaxPrefixPins, MaxTotalPrefixTokens)
			return r
		}
		p := PrefixPin{AdapterID: c.AdapterID, Hash: c.PrefixHash, Tokens: c.Tokens, Nodes: c.Nodes, Version: idx}
		if !ok {
			st.tokens += len(p.Tokens)
		} else {
			p.Tokens = cur.Tokens
		}
		st.prefixes[k] = p
		f.record(Change{Kind: ChangePinPrefix, Index: idx, Prefix: p})
		r.Version = idx
	case OpUnpinPrefix:
		k := PrefixKey{c.AdapterID, c.PrefixHash}
		cur, ok := st.prefixes[k]
		if ok && len(c.Tokens) > 0 && !slices.Equal(cur.Tokens, c.Tokens) {
			ok = false // a colliding prefix is not this one
			cur = PrefixPin{}
		}
		if r.Err = check(c.Cond, cur.Version); r.Err != nil {
			return r
		}
		if !ok {
			r.Err = fmt.Errorf("%w: prefix %016x of adapter %d is not pinned", ErrNotFound, c.PrefixHash, c.AdapterID)
			return r
		}
		delete(st.prefixes, k)
		st.tokens -= len(cur.Tokens)
		f.record(Change{Kind: ChangeUnpinPrefix, Index: idx, Prefix: cur})
	case OpSetServer:
		st.servers[c.ServerID] = c.Addr
	default:
		r.Err = fmt.Errorf("%w: unknown operation %d", ErrInvalid, uint8(c.Op))
	}
	return r
}

// record appends a change to the bounded journal. Callers hold f.mu.
func (f *FSM) record(c Change) {
	if len(f.journal) == journalCap {
		f.floor = f.journal[0].Index
		// Drop every change of the oldest index together, so floor stays exact.
		n := 1
		for n < len(f.journal) && f.journal[n].Index == f.floor {
			n++
		}
		f.journal = append(f.journal[:0], f.journal[n:]...)
	}
	f.journal = append(f.journal, c)
}

// Snapshot implements raft.FSM: it captures an immutable copy of the table; Persist serialises.
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return &fsmSnapshot{st: f.st.clone()}, nil
}

// Restore implements raft.FSM: it replaces the whole table with a snapshot, refusing a damaged
// one (bad checksum, bad encoding, an entry over a cap) and leaving the table unchanged then.
func (f *FSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	st, err := readSnapshot(rc)
	if err != nil {
		return fmt.Errorf("restore pins snapshot: %w", err)
	}
	f.mu.Lock()
	f.st = st
	f.journal = nil
	f.floor = st.applied
	f.mu.Unlock()
	f.restores.Add(1)
	f.notify()
	return nil
}

// Restores returns how many snapshots this FSM has restored.
func (f *FSM) Restores() uint64 { return f.restores.Load() }

// Subscribe returns a channel that receives a (coalesced) signal after every applied entry and
// restore, and a cancel function. Receivers read the FSM themselves; signals are never blocked on.
func (f *FSM) Subscribe() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	f.subMu.Lock()
	id := f.next
	f.next++
	f.subs[id] = ch
	f.subMu.Unlock()
	return ch, func() {
		f.subMu.Lock()
		delete(f.subs, id)
		f.subMu.Unlock()
	}
}

func (f *FSM) notify() {
	f.subMu.Lock()
	for _, ch := range f.subs {
		select {
		case ch <- struct{}{}:
		default: // a signal is pending already
		}
	}
	f.subMu.Unlock()
}

// AppliedIndex returns the index of the last entry applied (or restored).
func (f *FSM) AppliedIndex() uint64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.st.applied
}

// ChangesSince returns the changes with Index > after and the applied index they lead to. ok is
// false when some of them are no longer journaled (or the table was restored): take a View then.
func (f *FSM) ChangesSince(after uint64) (changes []Change, applied uint64, ok bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if after < f.floor || after > f.st.applied {
		return nil, f.st.applied, false
	}
	i, _ := slices.BinarySearchFunc(f.journal, after+1, func(c Change, idx uint64) int { return cmp.Compare(c.Index, idx) })
	return slices.Clone(f.journal[i:]), f.st.applied, true
}

// View is a consistent copy of the table, sorted.
type View struct {
	AppliedIndex uint64
	Adapters     []Adapter    // by ID
	Pins         []AdapterPin // by AdapterID
	Prefixes     []PrefixPin  // by (AdapterID, Hash)
}

// View returns a sorted copy of the table.
func (f *FSM) View() View {
	f.mu.RLock()
	st := f.st.clone()
	f.mu.RUnlock()
	return st.view()
}

func (s *state) view() View {
	v := View{AppliedIndex: s.applied}
	v.Adapters = slices.SortedFunc(maps.Values(s.adapters), func(a, b Adapter) int { return cmp.Compare(a.ID, b.ID) })
	v.Pins = slices.SortedFunc(maps.Values(s.pins), func(a, b AdapterPin) int { return cmp.Compare(a.AdapterID, b.AdapterID) })
	v.Prefixes = slices.SortedFunc(maps.Values(s.prefixes), func(a, b PrefixPin) int {
		return cmp.Or(cmp.Compare(a.AdapterID, b.AdapterID), cmp.Compare(a.Hash, b.Hash))
	})
	return v
}

// Adapter returns one adapter.
func (f *FSM) Adapter(id uint64) (Adapter, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	a, ok := f.st.adapters[id]
	return a, ok
}

// Pin returns an adapter's placement pin.
func (f *FSM) Pin(adapterID uint64) (AdapterPin, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	p, ok := f.st.pins[adapterID]
	return p, ok
}

// Prefix returns one prefix pin.
func (f *FSM) Prefix(k PrefixKey) (PrefixPin, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	p, ok := f.st.prefixes[k]
	return p, ok
}

// AllowedNodes returns the nodes an adapter may be routed to and whether it is pinned at all
// (unpinned: any node). The slice is shared and must not be modified.
func (f *FSM) AllowedNodes(adapterID uint64) ([]string, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	p, ok := f.st.pins[adapterID]
	return p.Nodes, ok
}

// PrefixPinsFor returns the prefix pins naming node, sorted by (adapter, hash).
func (f *FSM) PrefixPinsFor(node string) []PrefixPin {
	f.mu.RLock()
	var out []PrefixPin
	for _, p := range f.st.prefixes {
		if _, ok := slices.BinarySearch(p.Nodes, node); ok {
			out = append(out, p)
		}
	}
	f.mu.RUnlock()
	slices.SortFunc(out, func(a, b PrefixPin) int {
		return cmp.Or(cmp.Compare(a.AdapterID, b.AdapterID), cmp.Compare(a.Hash, b.Hash))
	})
	return out
}

// ServerAddr returns the gRPC address a raft server registered.
func (f *FSM) ServerAddr(id string) (string, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	a, ok := f.st.servers[id]
	return a, ok
}
