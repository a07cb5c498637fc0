package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// waitGoroutines waits (bounded) until the goroutine count is back to at most want.
func waitGoroutines(t *testing.T, want int, what string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		n := runtime.NumGoroutine()
		if n <= want {
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			t.Fatalf("%s: %d goroutines, baseline %d\n%s", what, n, want, buf)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// 1,000 replays abandoned after their first batch, each with 300 more batches on the way (more
// than the exchange's own 64-message queue and zmq4's 10-message one hold): zmq4's
// per-connection reader would block on its queue and keep the goroutine and the payloads for
// good; the drained close leaves the goroutine count at its baseline.
func TestReplayAbandonedLeavesNoGoroutines(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pc := DefaultPublisherConfig()
	pc.Endpoint, pc.Replay = "tcp://127.0.0.1:0", "tcp://127.0.0.1:0"
	var warns warnCounter
	p, err := NewPublisher(ctx, pc, slog.New(&warns))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for i := 0; i < 301; i++ {
		p.Publish(1, []Event{{Kind: KindStored, Hashes: []uint64{uint64(i + 1)}, Tokens: toks(i*4, 4), BlockSize: 4}})
	}
	// A first exchange warms up whatever the runtime and the publisher start once.
	if _, _, _, err := Replay(ctx, p.ReplayAddr(), 0, func(uint64, []byte) error { return errStop }); !errors.Is(err, errStop) {
		t.Fatal(err)
	}
	waitGoroutines(t, runtime.NumGoroutine(), "after one replay")
	base := runtime.NumGoroutine()
	for i := 0; i < 1000; i++ {
		rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
		first, n, _, err := Replay(rctx, p.ReplayAddr(), 0, func(uint64, []byte) error { return errStop })
		rcancel()
		if !errors.Is(err, errStop) || first != 0 || n != 1 {
			t.Fatalf("replay %d: first %d, n %d, %v", i, first, n, err)
		}
	}
	waitGoroutines(t, base, "after 1,000 abandoned replays")
	// A requester leaving mid-reply is ordinary: the publisher does not warn about it.
	if n := warns.n.Load(); n != 0 {
		t.Fatalf("the publisher logged %d warnings for requesters that left", n)
	}
}

// warnCounter is a slog handler counting records at WARN and above.
type warnCounter struct{ n atomic.Int64 }

func (w *warnCounter) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w *warnCounter) Handle(context.Context, slog.Record) error    { w.n.Add(1); return nil }
func (w *warnCounter) WithAttrs([]slog.Attr) slog.Handler           { return w }
func (w *warnCounter) WithGroup(string) slog.Handler                { return w }

// The idle probe backs off on a quiet engine: doubling from IdleProbe to 32 s while probes find
// nothing, back to IdleProbe when one does.
func TestIdleProbeBackoff(t *testing.T) {
	base, every := 2*time.Second, 2*time.Second
	var got []time.Duration
	for range 6 {
		every = nextIdleProbe(every, base, false)
		got = append(got, every)
	}
	want := []time.Duration{4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second, 32 * time.Second, 32 * time.Second}
	if !slices.Equal(got, want) {
		t.Fatalf("back-off %v, want %v", got, want)
	}
	if nextIdleProbe(32*time.Second, base, true) != base {
		t.Fatal("a probe that found something does not reset the interval")
	}
	if nextIdleProbe(time.Minute, time.Minute, false) != time.Minute {
		t.Fatal("an IdleProbe above the cap is not kept")
	}
}

// zmtpPeer is a raw TCP peer that speaks just enough ZMTP 3.0 (RFC 23) by hand to get through
// zmq4's handshake as a socket of type sockType.
func zmtpPeer(t *testing.T, addr, sockType string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(addr, "tcp://"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	g := make([]byte, 64)
	g[0], g[9], g[10], g[11] = 0xff, 0x7f, 3, 0
	copy(g[12:], "NULL")
	if _, err := c.Write(g); err != nil {
		t.Fatal(err)
	}
	var body []byte
	body = append(body, 5)
	body = append(body, "READY"...)
	body = append(body, byte(len("Socket-Type")))
	body = append(body, "Socket-Type"...)
	body = binary.BigEndian.AppendUint32(body, uint32(len(sockType)))
	body = append(body, sockType...)
	if _, err := c.Write(append([]byte{0x04, byte(len(body))}, body...)); err != nil {
		t.Fatal(err)
	}
	// The other side's greeting and READY.
	if _, err := io.ReadFull(c, make([]byte, 64)); err != nil {
		t.Fatal(err)
	}
	var hdr [2]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, make([]byte, hdr[1])); err != nil {
		t.Fatal(err)
	}
	return c
}

// A peer declaring a 1 TiB frame is answered with a closed connection, and the process does not
// try to allocate it (zmq4 alone would make([]byte, 1<<40) and die of it); the follower keeps
// listening for the engine.
func TestFollowerRefusesHugeFrame(t *testing.T) {
	const bs = 4
	l := startListening(t, bs, nil)
	m, cfg := l.m, l.cfg

	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	c := zmtpPeer(t, cfg.Endpoint, "PUB")
	defer c.Close()
	hdr := []byte{0x02, 0, 0, 0, 0, 0, 0, 0, 0} // LONG message frame
	binary.BigEndian.PutUint64(hdr[1:], 1<<40)
	if _, err := c.Write(hdr); err != nil {
		t.Fatal(err)
	}
	// The follower may have sent its subscription first; then the connection must end.
	if _, err := io.Copy(io.Discard, c); err != nil && !errors.Is(err, net.ErrClosed) && !strings.Contains(err.Error(), "reset") {
		t.Fatalf("the connection stayed open after a 1 TiB frame header: %v", err)
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<20 {
		t.Fatalf("allocated %d bytes for a frame it refused", grew)
	}

	// The engine still gets through.
	pub := l.dialEngine()
	e := NewEncoder(LayoutArray, HashInt)
	a := toks(1, 4)
	deadline := time.Now().Add(20 * time.Second)
	for m.PeekMatchedTokens(a, bs, 0) != 4 {
		if time.Now().After(deadline) {
			t.Fatal("the engine's batch never arrived")
		}
		var s8 [8]byte
		if err := pub.SendMulti(zmq4.NewMsgFrom([]byte{}, s8[:], e.Encode(1, []Event{{Kind: KindStored, Hashes: []uint64{7}, Tokens: a, BlockSize: bs}}, 0))); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// With --kv-events-listen, a stranger that connects and leaves (a port scan, a misdirected
// publisher) ends only its own connection: the engine's stream goes on without a gap.
func TestFollowerListenStrangerLeaves(t *testing.T) {
	const bs = 4
	l := startListening(t, bs, nil)
	m, cfg, f := l.m, l.cfg, l.f
	pub := l.dialEngine()
	e := NewEncoder(LayoutArray, HashInt)
	var seq uint64
	send := func(h uint64, tk []uint32) {
		var s8 [8]byte
		putSeq(s8[:], seq)
		seq++
		// zmq4's PUB queues the message: it gets its own copy of the encoder's bytes.
		payload := append([]byte(nil), e.Encode(1, []Event{{Kind: KindStored, Hashes: []uint64{h}, Tokens: tk, BlockSize: bs}}, 0)...)
		if err := pub.SendMulti(zmq4.NewMsgFrom([]byte{}, s8[:], payload)); err != nil {
			t.Fatal(err)
		}
	}
	// seq 0 until the subscription takes, so the rank starts complete.
	a := toks(1, 4)
	deadline := time.Now().Add(20 * time.Second)
	for m.PeekMatchedTokens(a, bs, 0) != 4 {
		if time.Now().After(deadline) {
			t.Fatal("nothing mirrored")
		}
		seq = 0
		send(7, a)
		time.Sleep(10 * time.Millisecond)
	}
	waitFor(t, "complete", f.Complete)

	// A stranger: a ZMQ PUB that connects and closes, then a raw TCP peer that completes the
	// handshake and hangs up.
	stranger := zmq4.NewPub(l.ctx)
	if err := stranger.Dial(cfg.Endpoint); err != nil {
		t.Fatal(err)
	}
	_ = stranger.Close()
	c := zmtpPeer(t, cfg.Endpoint, "PUB")
	_ = c.Close()
	waitFor(t, "the strangers' disconnects seen", func() bool {
		return testutil.ToFloat64(f.met.peerEnds.WithLabelValues("0")) >= 2
	})

	// The engine's stream continues: every batch applied, no gap, no resync, still complete.
	for i := 0; i < 20; i++ {
		send(uint64(100+i), toks(100+4*i, 4))
	}
	waitFor(t, "the engine's later batches", func() bool { return m.PeekMatchedTokens(toks(100+4*19, 4), bs, 0) == 4 })
	for i := 0; i < 20; i++ {
		if m.PeekMatchedTokens(toks(100+4*i, 4), bs, 0) != 4 {
			t.Fatalf("batch %d lost (gaps %v, resyncs %v)", i, testutil.ToFloat64(f.met.gaps.WithLabelValues("0")),
				testutil.ToFloat64(f.met.resyncs.WithLabelValues("0", "gap")))
		}
	}
	if g := testutil.ToFloat64(f.met.gaps.WithLabelValues("0")); g != 0 || !f.Complete() {
		t.Fatalf("gaps %v, complete %v: the stranger interrupted the engine's stream", g, f.Complete())
	}
}

// Follower.Close leaves nothing running: its SUB connections are closed and the library's
// readers drained (a burst still queued in them included), its replay exchanges ended.
func TestFollowerCloseLeavesNoGoroutines(t *testing.T) {
	const bs = 4
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pc := DefaultPublisherConfig()
	pc.Endpoint, pc.Replay = "tcp://127.0.0.1:0", "tcp://127.0.0.1:0"
	p, err := NewPublisher(ctx, pc, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	waitGoroutines(t, runtime.NumGoroutine(), "publisher started")
	base := runtime.NumGoroutine()
	for round := 0; round < 3; round++ {
		m := NewCacheMirror(bs)
		cfg := DefaultConfig()
		cfg.Endpoint, cfg.Replay = p.Addr(), p.ReplayAddr()
		f, err := NewFollower(cfg, m, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		f.Start(ctx)
		waitFor(t, "connected", f.Connected)
		last := toks(1000*round, 4)
		deadline := time.Now().Add(20 * time.Second)
		for m.PeekMatchedTokens(last, bs, 0) != 4 {
			if time.Now().After(deadline) {
				t.Fatal("nothing mirrored")
			}
			for i := 0; i < 100; i++ { // a burst, some of it still queued when Close comes
				p.Publish(1, []Event{{Kind: KindStored, Hashes: []uint64{uint64(100000*round + i + 1)}, Tokens: toks(1000*round+4*i, 4), BlockSize: bs}})
			}
			// Give the burst time to arrive before the next: bursts sent back to back on a loaded
			// machine outrun the follower, whose gaps then keep clearing what it mirrored.
			for settle := time.Now().Add(250 * time.Millisecond); time.Now().Before(settle) && m.PeekMatchedTokens(last, bs, 0) != 4; {
				time.Sleep(5 * time.Millisecond)
			}
		}
		f.Close()
	}
	waitGoroutines(t, base, "after three followers closed")
}
