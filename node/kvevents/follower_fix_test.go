package kvevents

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// These tests drive the real Follower (sockets, replay DEALER, timers) through the three cases
// the rank machine's traces (testdata/follower) also cover, so the driver is checked end to end.

// A checkpoint restored beside a quiet engine whose replay buffer moved past it: the restored
// mirror stays (partial, credited, not cold) through the idle probes; the engine being quiet is
// no reason to drop it.
func TestFollowerRestoreQuietEngineKeepsCheckpoint(t *testing.T) {
	const bs = 4
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pc := DefaultPublisherConfig()
	pc.Endpoint, pc.Replay, pc.BufferSteps = "tcp://127.0.0.1:0", "tcp://127.0.0.1:0", 2
	pub, err := NewPublisher(ctx, pc, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	a := toks(1, 4)
	m, f := restoreRun(t, ctx, pub, true, []Event{{Kind: KindStored, Hashes: []uint64{1}, Tokens: a, BlockSize: bs}}, func() {
		for i := 0; i < 4; i++ { // the buffer (2 batches) moves past the checkpoint's last batch
			pub.Publish(2, []Event{{Kind: KindStored, Hashes: []uint64{uint64(50 + i)}, Tokens: toks(50+4*i, 4), BlockSize: bs}})
		}
	})
	waitFor(t, "restored, partial, warm", func() bool {
		return !f.Cold() && !f.Complete() && m.PeekMatchedTokens(a, bs, 0) == 4
	})
	// The first idle probe comes after IdleProbe (2 s), the next after 4 s more.
	time.Sleep(f.cfg.IdleProbe + time.Second)
	if got := m.PeekMatchedTokens(a, bs, 0); got != 4 || f.Complete() || f.Cold() {
		t.Fatalf("after an idle probe: restored prefix matches %d tokens (want 4), complete %v, cold %v", got, f.Complete(), f.Cold())
	}
}

// An event of a kind this agent does not know that names no blocks is counted and skipped: the
// batch applies whole and the rank stays exact.
func TestFollowerUnknownEventKeepsMirror(t *testing.T) {
	const bs = 4
	l := startListening(t, bs, nil)
	m, f, pub := l.m, l.f, l.dialEngine()
	sendRaw := func(seq uint64, payload []byte) {
		var s8 [8]byte
		putSeq(s8[:], seq)
		if err := pub.SendMulti(zmq4.NewMsgFrom([]byte{}, s8[:], payload)); err != nil {
			t.Fatal(err)
		}
	}
	e := NewEncoder(LayoutArray, HashInt)
	a, b := toks(1, 4), toks(20, 4)
	deadline := time.Now().Add(20 * time.Second)
	for m.PeekMatchedTokens(a, bs, 0) != 4 {
		if time.Now().After(deadline) {
			t.Fatal("nothing mirrored")
		}
		sendRaw(0, e.Encode(1, []Event{{Kind: KindCleared}, {Kind: KindStored, Hashes: []uint64{7}, Tokens: a, BlockSize: bs}}, 0))
		time.Sleep(10 * time.Millisecond)
	}
	waitFor(t, "complete", f.Complete)
	time.Sleep(50 * time.Millisecond) // repeated seq 0 batches applied
	before := testutil.ToFloat64(f.met.batches.WithLabelValues("0"))
	sendRaw(1, enc(t, []any{1.0, []any{
		[]any{"KVCacheStats", 17, 0.5},
		map[string]any{"type": "EngineHeartbeat", "uptime": 3},
		[]any{"BlockStored", []uint64{8}, 7, []int{20, 21, 22, 23}, bs},
	}, 0}))
	waitFor(t, "the batch applied", func() bool { return testutil.ToFloat64(f.met.batches.WithLabelValues("0")) > before })
	if m.PeekMatchedTokens(a, bs, 0) != 4 || m.PeekMatchedTokens(append(append([]uint32(nil), a...), b...), bs, 0) != 8 || !f.Complete() {
		t.Fatalf("a block-less unknown event cleared the rank (a matches %d, a+b %d) or made it partial (complete %v)",
			m.PeekMatchedTokens(a, bs, 0), m.PeekMatchedTokens(append(append([]uint32(nil), a...), b...), bs, 0), f.Complete())
	}
	if n := testutil.ToFloat64(f.met.skipped.WithLabelValues("0", "unknown_tag")); n != 2 {
		t.Fatalf("events_skipped_total{reason=unknown_tag} = %v, want 2", n)
	}
}

// fakeEngine is a PUB socket and a replay ROUTER answering every request with its whole buffer
// (lower sequences included), an engine whose replay shows a restart by its sequence numbers.
type fakeEngine struct {
	t      *testing.T
	pub    zmq4.Socket
	router zmq4.Socket
	enc    *Encoder
	buf    chan map[uint64][]byte
}

func startFakeEngine(t *testing.T, ctx context.Context) *fakeEngine {
	t.Helper()
	port, rport := freePorts(t, 1), freePorts(t, 1)
	fe := &fakeEngine{t: t, pub: zmq4.NewPub(ctx), router: zmq4.NewRouter(ctx), enc: NewEncoder(LayoutArray, HashInt), buf: make(chan map[uint64][]byte, 1)}
	fe.buf <- map[uint64][]byte{}
	t.Cleanup(func() { _ = fe.pub.Close(); _ = fe.router.Close() })
	if err := fe.pub.Listen("tcp://127.0.0.1:" + itoa(port)); err != nil {
		t.Fatal(err)
	}
	if err := fe.router.Listen("tcp://127.0.0.1:" + itoa(rport)); err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			msg, err := fe.router.Recv()
			if err != nil {
				return
			}
			id := msg.Frames[0]
			b := <-fe.buf
			var seqs []uint64
			for s := range b {
				seqs = append(seqs, s)
			}
			for i := range seqs {
				for j := i + 1; j < len(seqs); j++ {
					if seqs[j] < seqs[i] {
						seqs[i], seqs[j] = seqs[j], seqs[i]
					}
				}
			}
			var out []zmq4.Msg
			for _, s := range seqs {
				var s8 [8]byte
				putSeq(s8[:], s)
				out = append(out, zmq4.NewMsgFrom(id, []byte{}, s8[:], b[s]))
			}
			fe.buf <- b
			for _, o := range out {
				_ = fe.router.SendMulti(o)
			}
			var end [8]byte
			putSeq(end[:], EndSeq)
			_ = fe.router.SendMulti(zmq4.NewMsgFrom(id, []byte{}, end[:], []byte{}))
		}
	}()
	return fe
}

func (fe *fakeEngine) endpoints() (string, string) {
	return tcpAddr(fe.pub.Addr()), tcpAddr(fe.router.Addr())
}

// publish buffers seq's batch and, when live, sends it.
func (fe *fakeEngine) publish(seq uint64, live bool, evs ...Event) {
	p := append([]byte(nil), fe.enc.Encode(1, evs, 0)...)
	b := <-fe.buf
	b[seq] = p
	fe.buf <- b
	if live {
		var s8 [8]byte
		putSeq(s8[:], seq)
		if err := fe.pub.SendMulti(zmq4.NewMsgFrom([]byte{}, s8[:], p)); err != nil {
			fe.t.Fatal(err)
		}
	}
}

// restart forgets the buffer (a new engine process).
func (fe *fakeEngine) restart() {
	<-fe.buf
	fe.buf <- map[uint64][]byte{}
}

// A live gap whose replay answers with sequences below the one asked for: the engine restarted
// in the middle of the gap. The rank moves to a new epoch (OnRestart), the old cache is dropped
// and the mirror rebuilt from the new engine's batches, exact.
func TestFollowerReplayRevealsRestart(t *testing.T) {
	const bs = 4
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fe := startFakeEngine(t, ctx)
	var log hookLog
	m := NewCacheMirror(bs)
	cfg := DefaultConfig()
	cfg.Endpoint, cfg.Replay = fe.endpoints()
	cfg.OnRestart = func(rank int) { log.add(fmt.Sprintf("restart(%d)", rank)) }
	f, err := NewFollower(cfg, m, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	f.Start(ctx)
	defer f.Close()
	waitFor(t, "connected", f.Connected)
	a, c, d := toks(1, 4), toks(40, 4), toks(60, 4)
	fe.publish(0, false, Event{Kind: KindStored, Hashes: []uint64{1}, Tokens: a, BlockSize: bs})
	deadline := time.Now().Add(20 * time.Second)
	for seq := uint64(1); m.PeekMatchedTokens(a, bs, 0) != 4 || !f.Complete(); seq++ {
		if time.Now().After(deadline) {
			t.Fatal("nothing mirrored")
		}
		fe.publish(seq, true, Event{Kind: KindStored, Hashes: []uint64{100 + seq}, Tokens: toks(1000+4*int(seq), 4), BlockSize: bs})
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // the last live batches applied
	fe.restart()
	fe.publish(0, false, Event{Kind: KindStored, Hashes: []uint64{3}, Tokens: c, BlockSize: bs})
	for seq := uint64(1); seq < 40; seq++ { // lost live, kept in the buffer
		fe.publish(seq, false, Event{Kind: KindStored, Hashes: []uint64{200 + seq}, Tokens: toks(3000+4*int(seq), 4), BlockSize: bs})
	}
	fe.publish(40, true, Event{Kind: KindStored, Hashes: []uint64{4}, Tokens: d, BlockSize: bs})
	waitFor(t, "the new engine mirrored", func() bool { return m.PeekMatchedTokens(d, bs, 0) == 4 })
	time.Sleep(100 * time.Millisecond)
	if got := log.String(); !strings.Contains(got, "restart(0)") || m.PeekMatchedTokens(a, bs, 0) != 0 || m.PeekMatchedTokens(c, bs, 0) != 4 || !f.Complete() {
		t.Fatalf("hooks %q, old block matches %d (want 0), new engine's first block matches %d (want 4), complete %v (want true)",
			got, m.PeekMatchedTokens(a, bs, 0), m.PeekMatchedTokens(c, bs, 0), f.Complete())
	}
}
