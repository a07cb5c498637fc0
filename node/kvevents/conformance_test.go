package kvevents

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/prefixmesh/prefixmesh/internal/testenv"
)

// The conformance publisher (testdata/conformance_pub.py) is written from the wire description
// with Debian's python3-zmq and python3-msgpack (scripts/test.sh installs them). These tests drive
// the real Follower (ZMQ SUB, DEALER replay, decoder, mirror) against it and check, after every
// step, that the mirror's summary equals what the publisher's engine holds.

const pyPublisher = "testdata/conformance_pub.py"

// systemPython is Debian's interpreter: python3-* packages are importable only by it.
const systemPython = "/usr/bin/python3"

func requirePython(t *testing.T) {
	t.Helper()
	out, err := exec.Command(systemPython, "-c", "import zmq, msgpack").CombinedOutput()
	if err != nil {
		testenv.Missing(t, "Debian's python3-zmq and python3-msgpack", fmt.Errorf("%v: %s", err, out), "apt-get install python3-zmq python3-msgpack (scripts/test.sh does in CI)")
	}
}

type pyPub struct {
	t      *testing.T
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Scanner
	pub    string
	replay string
}

func startPy(t *testing.T, args ...string) *pyPub {
	t.Helper()
	requirePython(t)
	cmd := exec.Command(systemPython, append([]string{pyPublisher}, args...)...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &pyPub{t: t, cmd: cmd, in: in, out: bufio.NewScanner(stdout)}
	p.out.Buffer(make([]byte, 1<<20), 1<<20)
	t.Cleanup(func() {
		_ = in.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	var hello struct{ Pub, Replay *string }
	p.read(&hello)
	p.pub = *hello.Pub
	if hello.Replay != nil {
		p.replay = *hello.Replay
	}
	return p
}

func (p *pyPub) read(v any) {
	p.t.Helper()
	if !p.out.Scan() {
		p.t.Fatalf("publisher exited: %v", p.out.Err())
	}
	if err := json.Unmarshal(p.out.Bytes(), v); err != nil {
		p.t.Fatalf("publisher said %q: %v", p.out.Text(), err)
	}
}

type pyReply struct {
	Hashes  []json.Number `json:"hashes"` // Python ints: signed (SGLang) or unsigned (vLLM)
	Digests []string      `json:"digests"`
	Seq     uint64        `json:"seq"`
}

func (p *pyPub) do(cmd map[string]any) pyReply {
	p.t.Helper()
	b, _ := json.Marshal(cmd)
	if _, err := fmt.Fprintf(p.in, "%s\n", b); err != nil {
		p.t.Fatal(err)
	}
	var r pyReply
	p.read(&r)
	return r
}

// engineModel is what the publisher's engine holds, fed the same events as the mirror.
type engineModel struct {
	ref    *refMirror
	chains map[uint64][]uint32 // the last hash of a chain → its full tokens
}

func u64s(hs []json.Number) []uint64 {
	out := make([]uint64, len(hs))
	for i, h := range hs {
		out[i] = key(h)
	}
	return out
}

// key is a published hash as the decoder keys it: two's complement for a negative int.
func key(n json.Number) uint64 {
	if v, err := strconv.ParseInt(string(n), 10, 64); err == nil {
		return uint64(v)
	}
	v, err := strconv.ParseUint(string(n), 10, 64)
	if err != nil {
		panic(err)
	}
	return v
}

// storeEvent is the event the publisher sent for a store command, as the reference reads it.
func storeEvent(r pyReply, parent *uint64, tokens []uint32, bs int, lora, extra string) Event {
	ev := Event{Kind: KindStored, Hashes: u64s(r.Hashes), Tokens: tokens[:len(r.Hashes)*bs], BlockSize: bs, LoRAName: lora}
	if parent != nil {
		ev.Parent, ev.HasParent = *parent, true
	}
	if extra != "" {
		ev.Extra = make([]uint8, len(ev.Hashes))
		ev.Extra[0] = extraOther
	}
	return ev
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func converge(t *testing.T, m *CacheMirror, ref *refMirror, what string) {
	t.Helper()
	want := ref.summary()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := sortedSnapshot(m)
		if slices.Equal(got, want) {
			if err := m.check(); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: mirror has %d hashes, the engine %d", what, len(got), len(want))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func toks(start, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(start + i)
	}
	return out
}

func toJSONTokens(ts []uint32) []int {
	out := make([]int, len(ts))
	for i, t := range ts {
		out[i] = int(t)
	}
	return out
}

func TestConformance(t *testing.T) {
	cases := []struct {
		name string
		args []string
	}{
		{"vllm array int, replay without topic frame", []string{"--flavor", "vllm", "--layout", "array", "--hashes", "int", "--replay"}},
		{"vllm map bytes, replay with topic frame, topic", []string{"--flavor", "vllm", "--layout", "map", "--hashes", "bytes", "--replay", "--replay-topic", "--topic", "kv@10.0.0.1@m"}},
		{"vllm map int, no replay", []string{"--flavor", "vllm", "--layout", "map", "--hashes", "int"}},
		{"sglang array", []string{"--flavor", "sglang", "--layout", "array", "--replay"}},
		{"sglang map", []string{"--flavor", "sglang", "--layout", "map", "--replay"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { runConformance(t, c.args) })
	}
}

func runConformance(t *testing.T, args []string) {
	const bs = 4
	py := startPy(t, args...)
	sglang := slices.Contains(args, "sglang")
	hasReplay := py.replay != ""
	topic := ""
	if i := slices.Index(args, "--topic"); i >= 0 {
		topic = "kv@" // subscribe by prefix
	}

	m := NewCacheMirror(bs)
	ref := &refMirror{bs: bs, blocks: map[mkey]*refBlock{}}
	cfg := DefaultConfig()
	cfg.Endpoint, cfg.Replay, cfg.Topic = py.pub, py.replay, topic
	cfg.RedialInterval = 20 * time.Millisecond
	reg := prometheus.NewRegistry()
	f, err := NewFollower(cfg, m, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f.Start(ctx)
	defer f.Close()
	waitFor(t, "connected", f.Connected)

	// Baseline: the SUB may join after the first batches (ZMQ's slow joiner). With replay the
	// follower fetches them from seq 0; without, a clear gives it a clean baseline.
	apply := func(ev Event) { ref.apply(0, &ev) }
	if hasReplay {
		r := py.do(map[string]any{"op": "store", "tokens": toJSONTokens(toks(1, 8))})
		apply(storeEvent(r, nil, toks(1, 8), bs, "", ""))
		converge(t, m, ref, "first batch (replayed from 0 if the SUB joined late)")
		if !f.Complete() {
			t.Fatal("a mirror replayed from seq 0 is not complete")
		}
	} else {
		waitFor(t, "a clean baseline from AllBlocksCleared", func() bool {
			py.do(map[string]any{"op": "clear"})
			return f.Complete()
		})
		apply(Event{Kind: KindCleared})
	}

	// Chains with shared prefixes, LoRA and multimodal extra keys.
	a := toks(100, 32)
	ra := py.do(map[string]any{"op": "store", "tokens": toJSONTokens(a)})
	apply(storeEvent(ra, nil, a, bs, "", ""))
	if sglang {
		checkSGLangChain(t, a, bs, ra)
	}
	pa := key(ra.Hashes[3])
	b := toks(500, 8)
	rb := py.do(map[string]any{"op": "store", "tokens": toJSONTokens(b), "parent": ra.Hashes[3]})
	apply(storeEvent(rb, &pa, b, bs, "", ""))
	if !sglang {
		rl := py.do(map[string]any{"op": "store", "tokens": toJSONTokens(a[:8]), "lora": "7"})
		apply(storeEvent(rl, nil, a[:8], bs, "7", ""))
		rm := py.do(map[string]any{"op": "store", "tokens": toJSONTokens(toks(900, 8)), "extra": "mm"})
		apply(storeEvent(rm, nil, toks(900, 8), bs, "", "mm"))
	}
	converge(t, m, ref, "chains")
	if got := m.PeekMatchedTokens(append(a[:16:16], b...), bs, 0); got != 24 {
		t.Fatalf("peek of a[:16]+b = %d, want 24", got)
	}
	if !sglang {
		if got := m.PeekMatchedTokens(a, bs, 7); got != 8 {
			t.Fatalf("LoRA 7 peek = %d, want 8", got)
		}
		if got := m.PeekMatchedTokens(toks(900, 8), bs, 0); got != 0 {
			t.Fatalf("a block with multimodal extra keys matched a plain prompt: %d", got)
		}
	}

	// The same hash stored twice is removed twice; a removed interior block ends the match.
	h1 := key(ra.Hashes[1])
	py.do(map[string]any{"op": "store_again", "hash": ra.Hashes[1]})
	p0 := key(ra.Hashes[0])
	apply(Event{Kind: KindStored, Hashes: []uint64{h1}, Parent: p0, HasParent: true, Tokens: a[4:8], BlockSize: bs})
	py.do(map[string]any{"op": "remove", "hashes": []json.Number{ra.Hashes[1]}})
	apply(Event{Kind: KindRemoved, Hashes: []uint64{h1}})
	converge(t, m, ref, "one of two copies removed")
	if got := m.PeekMatchedTokens(a, bs, 0); got != 32 {
		t.Fatalf("peek after removing one copy = %d, want 32", got)
	}
	py.do(map[string]any{"op": "remove", "hashes": []json.Number{ra.Hashes[1]}})
	apply(Event{Kind: KindRemoved, Hashes: []uint64{h1}})
	converge(t, m, ref, "interior block removed")
	if got := m.PeekMatchedTokens(a, bs, 0); got != 4 {
		t.Fatalf("peek past a removed interior block = %d, want 4", got)
	}

	// Messages lost on the way (a PUB high-water-mark drop): a gap, then a replay.
	py.do(map[string]any{"op": "drop", "n": 2})
	var last pyReply
	for i := 0; i < 3; i++ {
		tk := toks(2000+100*i, 8)
		last = py.do(map[string]any{"op": "store", "tokens": toJSONTokens(tk)})
		apply(storeEvent(last, nil, tk, bs, "", ""))
	}
	if hasReplay {
		converge(t, m, ref, "gap replayed")
		// The replayed batches are applied as they arrive; the gap and the replay are counted
		// once the replay's reply is complete, a moment after the mirror has converged.
		waitFor(t, "the gap counted and replayed", func() bool {
			return testutil.ToFloat64(f.met.gaps.WithLabelValues("0")) >= 1 && testutil.ToFloat64(f.met.replays.WithLabelValues("0", "ok")) >= 1
		})
		waitFor(t, "the mirror complete after a successful replay", f.Complete)
	} else {
		// No replay: the rank is cleared and rebuilt from the batch after the gap, and marked cold.
		waitFor(t, "resync after an unreplayable gap", func() bool {
			return testutil.ToFloat64(f.met.resyncs.WithLabelValues("0", "gap")) >= 1
		})
		if f.Complete() {
			t.Fatal("mirror claims to be complete after an unreplayable gap")
		}
		ref = &refMirror{bs: bs, blocks: map[mkey]*refBlock{}}
		tk := toks(2200, 8)
		apply(storeEvent(last, nil, tk, bs, "", ""))
		converge(t, m, ref, "rebuilt after the gap")
	}

	if hasReplay {
		// A replay that no longer reaches back: the buffer forgot the lost batches.
		py.do(map[string]any{"op": "drop", "n": 1})
		tk := toks(3000, 8)
		r := py.do(map[string]any{"op": "store", "tokens": toJSONTokens(tk)})
		apply(storeEvent(r, nil, tk, bs, "", ""))
		py.do(map[string]any{"op": "forget"})
		tk2 := toks(3100, 8)
		r2 := py.do(map[string]any{"op": "store", "tokens": toJSONTokens(tk2)})
		waitFor(t, "resync when replay does not reach back", func() bool {
			return testutil.ToFloat64(f.met.resyncs.WithLabelValues("0", "gap")) >= 1
		})
		ref = &refMirror{bs: bs, blocks: map[mkey]*refBlock{}}
		apply(storeEvent(r2, nil, tk2, bs, "", ""))
		converge(t, m, ref, "rebuilt after a replay that did not reach back")
		if f.Complete() {
			t.Fatal("complete after a resync")
		}
		// An AllBlocksCleared makes it exact again.
		py.do(map[string]any{"op": "clear"})
		apply(Event{Kind: KindCleared})
		converge(t, m, ref, "cleared")
		waitFor(t, "complete after a clear", f.Complete)
	}

	// A restarted engine: the sequence starts at 0 again and nothing says the cache is empty.
	resets := 0
	py.do(map[string]any{"op": "restart"})
	tk := toks(4000, 12)
	r := py.do(map[string]any{"op": "store", "tokens": toJSONTokens(tk)})
	ref = &refMirror{bs: bs, blocks: map[mkey]*refBlock{}}
	apply(storeEvent(r, nil, tk, bs, "", ""))
	converge(t, m, ref, "after an engine restart")
	resets = int(testutil.ToFloat64(f.met.resyncs.WithLabelValues("0", "restart")))
	if resets != 1 {
		t.Fatalf("restart resyncs = %d, want 1", resets)
	}
	if !f.Complete() {
		t.Fatal("a mirror restarted at seq 0 is not complete")
	}

	// A burst: many batches back to back, each applied in order.
	for i := 0; i < 200; i++ {
		tk := toks(10000+8*i, 8)
		r := py.do(map[string]any{"op": "store", "tokens": toJSONTokens(tk)})
		apply(storeEvent(r, nil, tk, bs, "", ""))
	}
	converge(t, m, ref, "burst")
	if n := testutil.ToFloat64(f.met.decodeErrs.WithLabelValues("0")); n != 0 {
		t.Fatalf("%v decode errors", n)
	}

	// An unknown tag naming no blocks cannot have removed one: counted and skipped, the batch
	// applies whole and the rank stays exact.
	py.do(map[string]any{"op": "unknown_blockless"})
	waitFor(t, "a block-less unknown tag counted", func() bool {
		return testutil.ToFloat64(f.met.skipped.WithLabelValues("0", "unknown_tag")) >= 1
	})
	converge(t, m, ref, "after a block-less unknown event: unchanged")
	if !f.Complete() || testutil.ToFloat64(f.met.lossy.WithLabelValues("0")) != 0 {
		t.Fatal("a block-less unknown event made the rank partial")
	}

	// An unknown tag naming blocks inside a sequenced batch: what that event did to them is
	// unknown (it may have removed them), so the batch is a gap no replay can fill: counted,
	// the rank cleared and rebuilt from the batch's other events on, partial.
	py.do(map[string]any{"op": "unknown"})
	waitFor(t, "unknown tag counted as a lossy batch", func() bool {
		return testutil.ToFloat64(f.met.skipped.WithLabelValues("0", "unknown_removing")) >= 1 &&
			testutil.ToFloat64(f.met.lossy.WithLabelValues("0")) >= 1
	})
	ref = &refMirror{bs: bs, blocks: map[mkey]*refBlock{}}
	converge(t, m, ref, "after an unknown event: cleared")
	if f.Complete() {
		t.Fatal("complete after a batch with an unknown event")
	}
	tk = toks(30000, 8)
	r = py.do(map[string]any{"op": "store", "tokens": toJSONTokens(tk)})
	apply(storeEvent(r, nil, tk, bs, "", ""))
	converge(t, m, ref, "rebuilt after the unknown event")
}

// checkSGLangChain recomputes SGLang's page hashes in Go: sha256(previous digest ‖ tokens as
// little-endian uint32), published as the first 8 bytes read as a signed big-endian int64.
func checkSGLangChain(t *testing.T, tokens []uint32, bs int, r pyReply) {
	t.Helper()
	var prev []byte
	for i := range r.Hashes {
		h := sha256.New()
		h.Write(prev)
		var b [4]byte
		for _, tk := range tokens[i*bs : (i+1)*bs] {
			binary.LittleEndian.PutUint32(b[:], tk)
			h.Write(b[:])
		}
		d := h.Sum(nil)
		if hex.EncodeToString(d) != r.Digests[i] {
			t.Fatalf("page %d: Go digest %x, publisher %s", i, d, r.Digests[i])
		}
		if got := binary.BigEndian.Uint64(d[:8]); got != key(r.Hashes[i]) {
			t.Fatalf("page %d: key %d, publisher %s", i, got, r.Hashes[i])
		}
		prev = d
	}
}

// TestConformanceHWMDrops makes the publisher's PUB socket really drop messages at its
// high-water mark: the agent's applier is held (the mirror's lock taken) while the publisher
// sends a burst with a small send HWM and socket buffer, so the socket backs up and libzmq
// drops. Once released, the follower sees the gaps (a lost tail too, by its idle probe) and
// replays them, in several rounds since the publisher's ROUTER drops replies beyond its own
// HWM, and the mirror equals what was published.
func TestConformanceHWMDrops(t *testing.T) {
	const bs = 4
	py := startPy(t, "--flavor", "vllm", "--layout", "map", "--replay", "--hwm", "2", "--buffer-steps", "100000")
	m := NewCacheMirror(bs)
	ref := &refMirror{bs: bs, blocks: map[mkey]*refBlock{}}
	cfg := DefaultConfig()
	cfg.Endpoint, cfg.Replay, cfg.QueueLen = py.pub, py.replay, 1
	cfg.ReplayTimeout = 10 * time.Second
	f, err := NewFollower(cfg, m, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f.Start(ctx)
	defer f.Close()
	r := py.do(map[string]any{"op": "store", "tokens": toJSONTokens(toks(1, 4))})
	apply := func(ev Event) { ref.apply(0, &ev) }
	apply(storeEvent(r, nil, toks(1, 4), bs, "", ""))
	converge(t, m, ref, "baseline")

	const n = 20000
	m.mu.Lock() // the applier stalls on its next batch; the reader and the socket back up
	var burst pyReply
	b, _ := json.Marshal(map[string]any{"op": "burst", "n": n, "base": 100000})
	if _, err := fmt.Fprintf(py.in, "%s\n", b); err != nil {
		t.Fatal(err)
	}
	py.read(&burst)
	m.mu.Unlock()
	for i, h := range burst.Hashes {
		tk := make([]uint32, bs)
		for j := range tk {
			tk[j] = uint32(100000 + 4*i + j)
		}
		apply(Event{Kind: KindStored, Hashes: []uint64{key(h)}, Tokens: tk, BlockSize: bs})
	}
	converge(t, m, ref, "after the burst")
	gaps := testutil.ToFloat64(f.met.gaps.WithLabelValues("0"))
	t.Logf("burst of %d batches: %v gaps, %v replays", n, gaps, testutil.ToFloat64(f.met.replays.WithLabelValues("0", "ok")))
	if gaps < 1 {
		t.Fatal("no message was dropped at the high-water mark: the test did not test drops")
	}
	if !f.Complete() {
		t.Fatal("mirror incomplete after replays")
	}
}
