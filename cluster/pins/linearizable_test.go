package pins

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

var longRun = flag.Bool("pins.long", false, "run the linearizability test for 2 minutes with 3 voters and 1 minute with 5, instead of 12 s with 3")

// linKeys is the key space: adapters whose placement pins the clients compare-and-set. Small, so
// operations contend.
const linKeys = 3

type linInput struct {
	key    uint64
	read   bool
	expect uint64 // CAS: the version the client last read (0: absent)
	value  string // CAS: a value no other write uses
	// resolved CAS version, for writes whose outcome is unknown but whose value was observed
	version  uint64
	resolved bool
}

type linStatus uint8

const (
	linOK linStatus = iota
	linFail
	linUnknown
)

type linOutput struct {
	status  linStatus
	value   string // read
	version uint64 // read: the version; CAS ok: the new one; CAS fail: the current one
}

// linState is a key's state; known is false after a write with unknown outcome whose value no
// one observed (its version is then unknowable, and no read can return its value).
type linState struct {
	value   string
	version uint64
	known   bool
}

// pinModel is the sequential specification of one placement pin under CAS by version.
var pinModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		by := map[uint64][]porcupine.Operation{}
		for _, op := range history {
			k := op.Input.(linInput).key
			by[k] = append(by[k], op)
		}
		var out [][]porcupine.Operation
		for _, ops := range by {
			out = append(out, ops)
		}
		return out
	},
	Init: func() any { return linState{known: true} },
	Step: func(s, in, out any) (bool, any) {
		st, i, o := s.(linState), in.(linInput), out.(linOutput)
		if i.read {
			if o.value != st.value || (st.known && o.version != st.version) {
				return false, st
			}
			return true, linState{value: st.value, version: o.version, known: true}
		}
		match := st.known && st.version == i.expect
		switch o.status {
		case linOK:
			return match, linState{value: i.value, version: o.version, known: true}
		case linFail:
			return !match && (!st.known || o.version == st.version), st
		}
		if match { // unknown outcome: applied here, or linearized after everything (unseen)
			return true, linState{value: i.value, version: i.version, known: i.resolved}
		}
		return true, st
	},
	Equal: func(a, b any) bool { return a.(linState) == b.(linState) },
	DescribeOperation: func(in, out any) string {
		i, o := in.(linInput), out.(linOutput)
		if i.read {
			return fmt.Sprintf("read(%d) → %q@%d", i.key, o.value, o.version)
		}
		return fmt.Sprintf("cas(%d, %d, %q) → %v@%d", i.key, i.expect, i.value, o.status, o.version)
	},
}

// storeOf returns member i's current store (nil while it is down).
func (c *testCluster) storeOf(i int) *Store {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i].store
}

// TestLinearizableUnderFaults runs concurrent clients doing CAS writes and linearizable reads on
// a small key space, through random members (so writes are forwarded), while a nemesis
// partitions members and kills and restarts them; porcupine checks the history.
func TestLinearizableUnderFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	if !*longRun {
		runLinearizable(t, 3, 12*time.Second)
		return
	}
	t.Run("voters=3", func(t *testing.T) { runLinearizable(t, 3, 2*time.Minute) })
	t.Run("voters=5", func(t *testing.T) { runLinearizable(t, 5, time.Minute) })
}

func runLinearizable(t *testing.T, voters int, dur time.Duration) {
	c := newCluster(t, voters, nil)
	ld := c.leader(10 * time.Second)
	for k := uint64(1); k <= linKeys; k++ {
		mustWrite(t, ld.store, putAdapter(k))
	}

	start := time.Now()
	now := func() int64 { return int64(time.Since(start)) }
	ctx, stop := context.WithTimeout(context.Background(), dur)
	defer stop()

	var mu sync.Mutex // guards ops
	var ops []porcupine.Operation
	record := func(op porcupine.Operation) {
		mu.Lock()
		ops = append(ops, op)
		mu.Unlock()
	}

	var errMu sync.Mutex
	errKinds := map[string]int{}
	defer func() { t.Logf("unknown outcomes: %v", errKinds) }()
	var wg sync.WaitGroup
	const clients = 4
	for cl := 0; cl < clients; cl++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(cl), 42))
			lastRead := map[uint64]uint64{}
			for seq := 0; ctx.Err() == nil; seq++ {
				s := c.storeOf(rng.IntN(len(c.nodes)))
				if s == nil {
					continue
				}
				key := uint64(rng.IntN(linKeys) + 1)
				opCtx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
				in := linInput{key: key, read: rng.IntN(2) == 0}
				call := now()
				var out linOutput
				ret := int64(0)
				if in.read {
					if err := s.Sync(opCtx); err != nil {
						cancel()
						continue // a failed read has no effect: leave it out
					}
					p, _ := s.FSM().Pin(key)
					ret = now()
					out = linOutput{status: linOK, version: p.Version}
					if len(p.Nodes) > 0 {
						out.value = p.Nodes[0]
					}
					lastRead[key] = p.Version
				} else {
					in.expect = lastRead[key]
					in.value = fmt.Sprintf("c%d-%d", cl, seq)
					r, err := s.Write(opCtx, Command{Op: OpPinAdapter, AdapterID: key, Nodes: []string{in.value}, Cond: IfVersion(in.expect)})
					ret = now()
					var ve *VersionError
					switch {
					case err == nil:
						out = linOutput{status: linOK, version: r.Version}
					case errors.As(err, &ve):
						out = linOutput{status: linFail, version: ve.Current}
					case errors.Is(err, ErrInvalid), errors.Is(err, ErrNotFound):
						t.Errorf("unexpected write error: %v", err)
					default: // unavailable, closed, …: may or may not have been applied
						errMu.Lock()
						errKinds[errClass(err)]++
						errMu.Unlock()
						out = linOutput{status: linUnknown}
						ret = math.MaxInt64
					}
				}
				cancel()
				record(porcupine.Operation{ClientId: cl, Input: in, Call: call, Output: out, Return: ret})
			}
		}()
	}

	// The nemesis: one fault at a time, chosen at random: isolate a member (often the leader)
	// or crash it, then heal or restart it.
	wg.Add(1)
	faults := map[string]int{}
	go func() {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(7, 7))
		pause := func(lo, hi int) bool {
			tm := time.NewTimer(time.Duration(lo+rng.IntN(hi-lo)) * time.Millisecond)
			defer tm.Stop()
			select {
			case <-ctx.Done():
				return false
			case <-tm.C:
				return true
			}
		}
		for pause(200, 600) {
			i := rng.IntN(len(c.nodes))
			for j := range c.nodes { // prefer the leader half of the time
				if s := c.storeOf(j); s != nil && s.IsLeader() && rng.IntN(2) == 0 {
					i = j
				}
			}
			nd := c.nodes[i]
			if rng.IntN(2) == 0 {
				var others []string
				for _, o := range c.nodes {
					if o != nd {
						others = append(others, o.raftAddr)
					}
				}
				faults["partition"]++
				c.fault.partition(nd.raftAddr, others...)
				pause(200, 800)
				c.fault.heal()
			} else {
				faults["kill"]++
				c.kill(i)
				pause(100, 600)
				if err := c.startErr(i, false); err != nil {
					t.Errorf("restart: %v", err)
					return
				}
			}
		}
	}()
	wg.Wait()

	// Heal, then read every key linearizably once more: nothing acknowledged may be lost.
	c.fault.heal()
	final := c.leader(10 * time.Second)
	for k := uint64(1); k <= linKeys; k++ {
		call := now()
		if err := final.store.Sync(ctxT(t, 10*time.Second)); err != nil {
			t.Fatalf("final read: %v", err)
		}
		p, _ := final.store.FSM().Pin(k)
		out := linOutput{status: linOK, version: p.Version}
		if len(p.Nodes) > 0 {
			out.value = p.Nodes[0]
		}
		record(porcupine.Operation{ClientId: clients, Input: linInput{key: k, read: true}, Call: call, Output: out, Return: now()})
	}

	// No acknowledged write is lost: every key's final version is at least its last acked one
	// (porcupine checks the rest: the final reads are part of the history).
	for k := uint64(1); k <= linKeys; k++ {
		p, _ := final.store.FSM().Pin(k)
		for _, op := range ops {
			i, o := op.Input.(linInput), op.Output.(linOutput)
			if i.key == k && !i.read && o.status == linOK && o.version > p.Version {
				t.Fatalf("key %d: acknowledged write %q at version %d lost (final version %d)", k, i.value, o.version, p.Version)
			}
		}
	}

	// Resolve the versions of unknown-outcome writes whose values someone observed.
	seen := map[string]uint64{}
	counts := map[string]int{}
	for _, op := range ops {
		i, o := op.Input.(linInput), op.Output.(linOutput)
		switch {
		case i.read:
			seen[o.value] = o.version
			counts["read"]++
		case o.status == linOK:
			seen[i.value] = o.version
			counts["cas-ok"]++
		case o.status == linFail:
			counts["cas-fail"]++
		default:
			counts["cas-unknown"]++
		}
	}
	for n, op := range ops {
		i := op.Input.(linInput)
		if !i.read && op.Output.(linOutput).status == linUnknown {
			i.version, i.resolved = seen[i.value]
			ops[n].Input = i
		}
	}
	res, info := porcupine.CheckOperationsVerbose(pinModel, ops, time.Minute)
	t.Logf("%d operations %v under faults %v: %s", len(ops), counts, faults, res)
	if res != porcupine.Ok {
		if res == porcupine.Illegal {
			path := t.TempDir() + "/history.html"
			if err := porcupine.VisualizePath(pinModel, info, path); err == nil {
				t.Logf("visualization: %s", path)
			}
		}
		t.Fatalf("history is %s", res)
	}
	if counts["cas-ok"] == 0 || counts["read"] == 0 {
		t.Fatalf("workload made no progress: %v", counts)
	}
}

// errClass names the kind of an unknown-outcome failure, for the log.
func errClass(err error) string {
	msg := err.Error()
	for _, k := range []string{"leadership lost", "EOF", "deadline", "Canceled", "closed", "no leader"} {
		if strings.Contains(msg, k) {
			return k
		}
	}
	return "other"
}
