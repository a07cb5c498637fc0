package kvevents

// Scripted traces of one rank's follower: testdata/follower/*.txt, one scenario per file, run
// through the pure rank machine (rankmachine.go) and a real CacheMirror, with the engine's replay
// socket answered from the script. Each line is one step; '#' starts a comment.
//
//	config replay=false        the engine serves no replay socket (first line only; default true)
//	live seq=N EVENTS          the engine publishes batch N and it arrives live
//	live seq=N                 batch N, published before, arrives (again): a duplicate or a late one
//	lost seq=N EVENTS          the engine publishes batch N; it is lost on the way (the replay
//	                           buffer keeps it)
//	restart                    the engine process restarts: its published batches are forgotten
//	engine-restarted           the node agent saw the engine's start time change
//	tick                       the idle probe's timer fires
//	agent-restart              the agent checkpoints its mirror and restarts from the checkpoint
//	replay from=X -> ANSWER    the machine must now ask the replay socket for batches from X;
//	probe from=X -> ANSWER     or probe from X (it reads the first batch only); ANSWER is fed back
//	expect KEY=VALUE ...       checks the rank (see below); also while an exchange is awaited
//
// The machine's Start runs before the first line and after agent-restart. ANSWER is
// "seq=A..B" (the engine's batches A to B, then the end marker), "seq=A..B cut" (no end marker:
// the reply goes quiet), "empty" (the end marker only) or "none" (no answer: a timeout). EVENTS
// are separated by ';': "stored 1,2,3" (blocks chained in order, the first under the root;
// block h holds tokens 10h..10h+3), "stored 4 parent=3", "stored 2 medium=cpu" (a tier's copy
// of a block already seen: no tokens), "removed 2" (medium=cpu likewise), "cleared",
// "unknown TAG" (an event of a kind no engine publishes today, naming no blocks),
// "unknown TAG 1,2" (one naming blocks 1 and 2) and "malformed" (a BlockRemoved whose hashes
// are a string). expect keys: complete, cold (true/false), blocks, gpu, cpu (the rank's blocks
// holding any copy, a GPU copy, a CPU copy: sorted hashes, "-" for none), prov (provisional
// copies), restarts (OnRestart calls so far), and METRIC or METRIC.LABEL for the follower's
// counters (batches, skipped.unknown_tag, partial.checkpoint, resyncs.restart, replays.ok,
// gaps, lossy, …), counted from the start of the trace.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

const traceBS = 4

type traceRun struct {
	t         *testing.T
	file      string
	line      int
	hasReplay bool
	m         *rankMachine
	mir       *CacheMirror
	engine    map[uint64][]byte // the engine's published batches (this incarnation)
	pending   actKind           // the exchange the machine waits for (0: none)
	from      uint64
	complete  bool
	cold      bool
	restarts  int
	counts    map[string]int
}

func TestFollowerTraces(t *testing.T) {
	files, err := filepath.Glob("testdata/follower/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no traces: %v", err)
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".txt"), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			runTrace(t, file, string(data))
		})
	}
}

func runTrace(t *testing.T, file, script string) {
	tr := &traceRun{t: t, file: file, hasReplay: true, mir: NewCacheMirror(traceBS), engine: map[uint64][]byte{}, counts: map[string]int{}}
	started := false
	for i, raw := range strings.Split(script, "\n") {
		tr.line = i + 1
		line := strings.TrimSpace(raw)
		if j := strings.Index(line, "#"); j >= 0 {
			line = strings.TrimSpace(line[:j])
		}
		if line == "" {
			continue
		}
		if line == "config replay=false" {
			tr.hasReplay = false
			continue
		}
		if !started {
			tr.m = newRankMachine(0, tr.hasReplay, 2*time.Second)
			tr.do(tr.m.Start())
			started = true
		}
		verb, rest, _ := strings.Cut(line, " ")
		if tr.pending != 0 && verb != "replay" && verb != "probe" && verb != "expect" {
			tr.fail("the machine waits for its %s from=%d; the script says %q", actName(tr.pending), tr.from, line)
		}
		switch verb {
		case "live", "lost":
			seqArg, evs, _ := strings.Cut(rest, " ")
			seq := tr.seqArg(seqArg)
			if evs != "" {
				tr.engine[seq] = tr.payload(evs)
			} else if verb == "lost" {
				tr.fail("lost needs events")
			}
			p, ok := tr.engine[seq]
			if !ok {
				tr.fail("batch %d was never published", seq)
			}
			if verb == "live" {
				tr.do(tr.m.Live(seq, p, time.Time{}))
			}
		case "restart":
			tr.engine = map[uint64][]byte{}
		case "engine-restarted":
			tr.do(tr.m.EngineRestarted())
		case "tick":
			tr.do(tr.m.Tick(time.Time{}))
		case "agent-restart":
			mir, ck, err := ReadCheckpoint(bytes.NewReader(tr.mir.AppendCheckpoint(nil, 1, 0)), traceBS, 1)
			if err != nil {
				tr.fail("checkpoint: %v", err)
			}
			tr.mir, tr.m = mir, newRankMachine(0, tr.hasReplay, 2*time.Second)
			if ck.Ranks[0].Have {
				tr.do(tr.m.restore(ck.Ranks[0]))
			}
			tr.do(tr.m.Start())
		case "replay", "probe":
			tr.answer(verb, rest)
		case "expect":
			tr.expect(rest)
		default:
			tr.fail("unknown step %q", line)
		}
	}
	if tr.pending != 0 {
		tr.fail("the trace ends while the machine waits for its %s from=%d", actName(tr.pending), tr.from)
	}
}

func actName(k actKind) string {
	if k == actProbe {
		return "probe"
	}
	return "replay"
}

func (tr *traceRun) fail(format string, args ...any) {
	tr.t.Helper()
	tr.t.Fatalf("%s:%d: %s", tr.file, tr.line, fmt.Sprintf(format, args...))
}

func (tr *traceRun) seqArg(s string) uint64 {
	v, ok := strings.CutPrefix(s, "seq=")
	n, err := strconv.ParseUint(v, 10, 64)
	if !ok || err != nil {
		tr.fail("want seq=N, got %q", s)
	}
	return n
}

// do executes a machine's output as the driver would, with the mirror and counters in memory.
func (tr *traceRun) do(acts []action) {
	for _, a := range acts {
		switch a.kind {
		case actApply:
			for j := a.lo; j < a.hi; j++ {
				tr.mir.Apply(0, &a.batch.Events[j])
			}
		case actClear:
			tr.mir.Clear(0)
		case actRecordSeq:
			tr.mir.setSeq(0, a.pos)
		case actConfirm:
			tr.mir.ConfirmRestored(0)
		case actSetComplete:
			tr.complete = a.flag
		case actSetCold:
			tr.cold = a.flag
		case actNotifyRestart:
			tr.restarts++
		case actCount:
			name := [...]string{"batches", "skipped", "fields", "decode_errors", "gaps", "replays", "resyncs", "partial", "lossy"}[a.metric]
			if a.label != "" {
				name += "." + a.label
			}
			tr.counts[name] += a.n
		case actReplay, actProbe:
			tr.pending, tr.from = a.kind, a.seq
		}
	}
}

// answer feeds the exchange the machine waits for with the script's answer.
func (tr *traceRun) answer(verb, rest string) {
	req, ans, ok := strings.Cut(rest, " -> ")
	if !ok {
		tr.fail("want %s from=X -> ANSWER", verb)
	}
	from, err := strconv.ParseUint(strings.TrimPrefix(req, "from="), 10, 64)
	if err != nil {
		tr.fail("bad request %q", req)
	}
	if tr.pending == 0 || actName(tr.pending) != verb || tr.from != from {
		if tr.pending == 0 {
			tr.fail("the machine asks for nothing; the script expects a %s from=%d", verb, from)
		}
		tr.fail("the machine asks for a %s from=%d; the script expects a %s from=%d", actName(tr.pending), tr.from, verb, from)
	}
	tr.pending = 0
	var seqs []uint64
	complete, failed := true, false
	switch ans = strings.TrimSpace(ans); {
	case ans == "empty":
	case ans == "none":
		failed = true
	default:
		rng, cut := strings.CutSuffix(ans, " cut")
		complete = !cut
		a, b, ok := strings.Cut(strings.TrimPrefix(rng, "seq="), "..")
		lo, err1 := strconv.ParseUint(a, 10, 64)
		hi, err2 := strconv.ParseUint(b, 10, 64)
		if !ok || err1 != nil || err2 != nil || hi < lo {
			tr.fail("bad answer %q", ans)
		}
		for s := lo; s <= hi; s++ {
			if _, ok := tr.engine[s]; !ok {
				tr.fail("the answer holds batch %d, which the engine never published", s)
			}
			seqs = append(seqs, s)
		}
	}
	// Replay's results: the first sequence and count received, complete at the end marker, the
	// callback's error when it stopped the exchange, a timeout when nothing answers.
	var first uint64
	n := 0
	var stop error
	for _, s := range seqs {
		if n == 0 {
			first = s
		}
		n++
		if verb == "probe" {
			stop = tr.m.ProbeItem(s, tr.engine[s])
		} else {
			var acts []action
			acts, stop = tr.m.ReplayItem(s, tr.engine[s], time.Time{})
			tr.do(acts)
		}
		if stop != nil {
			break
		}
	}
	var err3 error
	switch {
	case failed:
		complete, err3 = false, context.DeadlineExceeded
	case stop != nil:
		complete, err3 = false, stop
	}
	if verb == "probe" {
		tr.do(tr.m.ProbeDone(first, n, complete, err3, time.Time{}))
	} else {
		tr.do(tr.m.ReplayDone(first, complete, err3, time.Time{}))
	}
}

// payload encodes EVENTS as one batch, positional (vLLM's array layout).
func (tr *traceRun) payload(spec string) []byte {
	var evs []any
	for _, e := range strings.Split(spec, ";") {
		f := strings.Fields(e)
		if len(f) == 0 {
			tr.fail("empty event in %q", spec)
		}
		opts := map[string]string{}
		var args []string
		for _, x := range f[1:] {
			if k, v, ok := strings.Cut(x, "="); ok {
				opts[k] = v
			} else {
				args = append(args, x)
			}
		}
		var medium any
		if v, ok := opts["medium"]; ok {
			medium = strings.ToUpper(v)
		}
		switch f[0] {
		case "stored":
			hs := tr.hashes(args)
			var parent any
			if p, ok := opts["parent"]; ok {
				parent = tr.hashes([]string{p})[0]
			}
			toks := []uint32{}
			if medium == nil {
				for _, h := range hs {
					for k := uint64(0); k < traceBS; k++ {
						toks = append(toks, uint32(10*h+k))
					}
				}
			}
			evs = append(evs, []any{"BlockStored", hs, parent, toks, traceBS, nil, medium})
		case "removed":
			evs = append(evs, []any{"BlockRemoved", tr.hashes(args), medium})
		case "cleared":
			evs = append(evs, []any{"AllBlocksCleared"})
		case "unknown":
			if len(args) == 0 {
				tr.fail("unknown needs a tag")
			}
			ev := []any{args[0]}
			if len(args) > 1 {
				ev = append(ev, tr.hashes(args[1:]))
			} else {
				ev = append(ev, 17, "stats") // a block-less payload
			}
			evs = append(evs, ev)
		case "malformed":
			evs = append(evs, []any{"BlockRemoved", "not-a-list", nil})
		default:
			tr.fail("unknown event %q", e)
		}
	}
	b, err := msgpack.Marshal([]any{0.0, evs, 0})
	if err != nil {
		tr.fail("encode: %v", err)
	}
	return b
}

func (tr *traceRun) hashes(args []string) []uint64 {
	var hs []uint64
	for _, a := range args {
		for _, x := range strings.Split(a, ",") {
			h, err := strconv.ParseUint(x, 10, 64)
			if err != nil {
				tr.fail("bad hash %q", x)
			}
			hs = append(hs, h)
		}
	}
	return hs
}

// expect checks KEY=VALUE pairs against the rank and its mirror.
func (tr *traceRun) expect(rest string) {
	tr.t.Helper()
	var blocks, gpu, cpu []uint64
	for k, i := range tr.mir.byKey {
		n := &tr.mir.nodes[i]
		if k.src>>16 != 0 || n.flags&fKnown == 0 || n.copies == ([numTiers]uint32{}) {
			continue
		}
		blocks = append(blocks, k.hash)
		if n.copies[TierGPU] > 0 {
			gpu = append(gpu, k.hash)
		}
		if n.copies[TierCPU] > 0 {
			cpu = append(cpu, k.hash)
		}
	}
	list := func(hs []uint64) string {
		if len(hs) == 0 {
			return "-"
		}
		slices.Sort(hs)
		s := make([]string, len(hs))
		for i, h := range hs {
			s[i] = strconv.FormatUint(h, 10)
		}
		return strings.Join(s, ",")
	}
	for _, kv := range strings.Fields(rest) {
		k, want, ok := strings.Cut(kv, "=")
		if !ok {
			tr.fail("want KEY=VALUE, got %q", kv)
		}
		var got string
		switch k {
		case "complete":
			got = strconv.FormatBool(tr.complete)
		case "cold":
			got = strconv.FormatBool(tr.cold)
		case "blocks":
			got = list(blocks)
		case "gpu":
			got = list(gpu)
		case "cpu":
			got = list(cpu)
		case "prov":
			got = strconv.Itoa(tr.mir.MirrorStats().Provisional)
		case "restarts":
			got = strconv.Itoa(tr.restarts)
		default:
			got = strconv.Itoa(tr.counts[k])
		}
		if got != want {
			tr.t.Errorf("%s:%d: %s=%s, want %s", tr.file, tr.line, k, got, want)
		}
	}
}
