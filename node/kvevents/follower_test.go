package kvevents

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// freePorts returns a base port with n consecutive free ports after it (checked by binding them
// all), for the rank-offset layout that needs port + rank.
func freePorts(t *testing.T, n int) int {
	t.Helper()
	for try := 0; try < 50; try++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		base := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		ok := true
		var ls []net.Listener
		for r := 0; r < n && ok; r++ {
			lr, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", itoa(base+r)))
			if err != nil {
				ok = false
				break
			}
			ls = append(ls, lr)
		}
		for _, lr := range ls {
			_ = lr.Close()
		}
		if ok {
			return base
		}
	}
	t.Fatal("no run of free ports")
	return 0
}

// listeningFollower is a follower started on a free loopback port with --kv-events-listen (the
// agent binds, the engine dials in), mirroring into a fresh mirror of block size bs; tune, when
// not nil, adjusts its configuration first (hooks). It stops when the test ends.
type listeningFollower struct {
	t   *testing.T
	ctx context.Context
	m   *CacheMirror
	cfg Config
	f   *Follower
}

func startListening(t *testing.T, bs int, tune func(m *CacheMirror, cfg *Config)) *listeningFollower {
	t.Helper()
	port := freePorts(t, 1)
	l := &listeningFollower{t: t, m: NewCacheMirror(bs), cfg: DefaultConfig()}
	l.cfg.Endpoint, l.cfg.Listen = "tcp://127.0.0.1:"+itoa(port), true
	if tune != nil {
		tune(l.m, &l.cfg)
	}
	f, err := NewFollower(l.cfg, l.m, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	f.Start(ctx)
	t.Cleanup(f.Close)
	waitFor(t, "listening", f.Connected)
	l.ctx, l.f = ctx, f
	return l
}

// dialEngine is a PUB socket dialled into the follower, as an engine configured to connect.
func (l *listeningFollower) dialEngine() zmq4.Socket {
	l.t.Helper()
	pub := zmq4.NewPub(l.ctx)
	l.t.Cleanup(func() { _ = pub.Close() })
	if err := pub.Dial(l.cfg.Endpoint); err != nil {
		l.t.Fatal(err)
	}
	return pub
}

func itoa(n int) string { return string(appendInt(nil, n)) }

func appendInt(b []byte, n int) []byte {
	if n >= 10 {
		b = appendInt(b, n/10)
	}
	return append(b, byte('0'+n%10))
}

// Two data-parallel ranks publish on port and port + 1 (and replay likewise); one follower with
// DPSize 2 mirrors both into one node: a prefix held by either rank is matched.
func TestFollowerDataParallelRanks(t *testing.T) {
	const bs = 4
	pubBase, repBase := freePorts(t, 2), freePorts(t, 2)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var pubs []*Publisher
	for r := 0; r < 2; r++ {
		pc := DefaultPublisherConfig()
		pc.Endpoint = "tcp://127.0.0.1:" + itoa(pubBase+r)
		pc.Replay = "tcp://127.0.0.1:" + itoa(repBase+r)
		pc.Rank = r
		p, err := NewPublisher(ctx, pc, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		pubs = append(pubs, p)
	}
	m := NewCacheMirror(bs)
	cfg := DefaultConfig()
	cfg.Endpoint, cfg.Replay, cfg.DPSize = "tcp://127.0.0.1:"+itoa(pubBase), "tcp://127.0.0.1:"+itoa(repBase), 2
	f, err := NewFollower(cfg, m, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	f.Start(ctx)
	defer f.Close()
	a, b := toks(1, 8), toks(100, 8)
	pubs[0].Publish(1, []Event{{Kind: KindStored, Hashes: []uint64{1, 2}, Tokens: a, BlockSize: bs}})
	pubs[1].Publish(1, []Event{{Kind: KindStored, Hashes: []uint64{1, 2}, Tokens: b, BlockSize: bs}}) // same hashes, another rank
	waitFor(t, "both ranks mirrored", func() bool {
		return m.PeekMatchedTokens(a, bs, 0) == 8 && m.PeekMatchedTokens(b, bs, 0) == 8 && f.Complete()
	})
	pubs[1].Publish(2, []Event{{Kind: KindCleared}})
	waitFor(t, "rank 1 cleared, rank 0 kept", func() bool {
		return m.PeekMatchedTokens(b, bs, 0) == 0 && m.PeekMatchedTokens(a, bs, 0) == 8
	})
}

// With --kv-events-listen the agent binds and the engine dials in (an engine configured with a
// concrete host connects instead of binding).
func TestFollowerListen(t *testing.T) {
	const bs = 4
	l := startListening(t, bs, nil)
	m, f, pub := l.m, l.f, l.dialEngine()
	e := NewEncoder(LayoutArray, HashInt)
	a := toks(1, 4)
	// No replay and a late subscription: clears give the mirror a clean baseline.
	var seq uint64
	send := func(evs []Event) {
		var s8 [8]byte
		putSeq(s8[:], seq)
		seq++
		if err := pub.SendMulti(zmq4.NewMsgFrom([]byte{}, s8[:], e.Encode(1, evs, 0))); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for m.PeekMatchedTokens(a, bs, 0) != 4 {
		if time.Now().After(deadline) {
			t.Fatal("engine dialling the agent: nothing mirrored")
		}
		send([]Event{{Kind: KindCleared}, {Kind: KindStored, Hashes: []uint64{7}, Tokens: a, BlockSize: bs}})
		time.Sleep(10 * time.Millisecond)
	}
	if !f.Complete() {
		t.Fatal("a mirror rebuilt from AllBlocksCleared is not complete")
	}
}

// A restarted engine process: the socket goes away, the follower redials, the new publisher's
// sequence starts at 0 again and nothing says the old cache is gone. The mirror drops what the
// old engine held and holds only what the new one publishes.
func TestFollowerEngineProcessRestart(t *testing.T) {
	const bs = 4
	port, rport := freePorts(t, 1), freePorts(t, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := func() *Publisher {
		pc := DefaultPublisherConfig()
		pc.Endpoint, pc.Replay = "tcp://127.0.0.1:"+itoa(port), "tcp://127.0.0.1:"+itoa(rport)
		var p *Publisher
		var err error
		for try := 0; try < 100; try++ { // the old process's port may linger a moment
			if p, err = NewPublisher(ctx, pc, nil); err == nil {
				return p
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatal(err)
		return nil
	}
	old := start()
	m := NewCacheMirror(bs)
	cfg := DefaultConfig()
	cfg.Endpoint, cfg.Replay = old.Addr(), old.ReplayAddr()
	cfg.RedialInterval = 20 * time.Millisecond
	f, err := NewFollower(cfg, m, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	f.Start(ctx)
	defer f.Close()
	a, b := toks(1, 8), toks(50, 8)
	for i := 0; i < 3; i++ {
		old.Publish(1, []Event{{Kind: KindStored, Hashes: []uint64{uint64(10 + 2*i), uint64(11 + 2*i)}, Tokens: a, BlockSize: bs}})
	}
	waitFor(t, "old engine mirrored", func() bool { return m.PeekMatchedTokens(a, bs, 0) == 8 })
	old.Close()
	restarted := start()
	defer restarted.Close()
	restarted.Publish(1, []Event{{Kind: KindStored, Hashes: []uint64{99, 98}, Tokens: b, BlockSize: bs}})
	waitFor(t, "new engine mirrored, old cache dropped", func() bool {
		return m.PeekMatchedTokens(b, bs, 0) == 8 && m.PeekMatchedTokens(a, bs, 0) == 0 && f.Complete()
	})
}

// hookLog records the follower's OnRestart and OnComplete calls.
type hookLog struct {
	mu    sync.Mutex
	calls []string
}

func (h *hookLog) add(s string) {
	h.mu.Lock()
	h.calls = append(h.calls, s)
	h.mu.Unlock()
}

func (h *hookLog) String() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return strings.Join(h.calls, " ")
}

// The hooks the node agent turns into gossip: OnComplete on every change of a rank's
// completeness (a clean start, a gap that cannot be replayed, a clear), OnRestart only when the
// engine restarted, called once the old cache is gone from the mirror.
func TestFollowerHooks(t *testing.T) {
	const bs = 4
	a, b, c := toks(1, 4), toks(20, 4), toks(40, 4)
	var log hookLog
	l := startListening(t, bs, func(m *CacheMirror, cfg *Config) { // no replay socket
		cfg.OnComplete = func(rank int, ok bool) { log.add(fmt.Sprintf("complete(%d,%v)", rank, ok)) }
		cfg.OnRestart = func(rank int) {
			log.add(fmt.Sprintf("restart(%d,old=%d)", rank, m.PeekMatchedTokens(a, bs, 0)+m.PeekMatchedTokens(b, bs, 0)))
		}
	})
	m, f, pub := l.m, l.f, l.dialEngine()
	e := NewEncoder(LayoutArray, HashInt)
	send := func(seq uint64, evs []Event) {
		var s8 [8]byte
		putSeq(s8[:], seq)
		if err := pub.SendMulti(zmq4.NewMsgFrom([]byte{}, s8[:], e.Encode(1, evs, 0))); err != nil {
			t.Fatal(err)
		}
	}
	// A late start without replay is partial (a lower bound); the first clear makes it complete. Until the
	// subscription takes, batches are lost: send until one lands.
	var seq uint64 = 10
	deadline := time.Now().Add(20 * time.Second)
	for m.PeekMatchedTokens(a, bs, 0) != 4 {
		if time.Now().After(deadline) {
			t.Fatal("nothing mirrored")
		}
		seq++
		send(seq, []Event{{Kind: KindCleared}, {Kind: KindStored, Hashes: []uint64{7}, Tokens: a, BlockSize: bs}})
		time.Sleep(10 * time.Millisecond)
	}
	waitFor(t, "complete after a clear", f.Complete)
	// A gap that cannot be replayed: partial (rebuilt from here, a lower bound) until the next clear.
	seq += 5
	send(seq, []Event{{Kind: KindStored, Hashes: []uint64{8}, Tokens: b, BlockSize: bs}})
	waitFor(t, "partial after a gap", func() bool { return !f.Complete() && m.PeekMatchedTokens(b, bs, 0) == 4 })
	seq++
	send(seq, []Event{{Kind: KindCleared}})
	waitFor(t, "complete after the clear", f.Complete)
	if strings.Contains(log.String(), "restart") {
		t.Fatalf("OnRestart without a restart: %s", &log)
	}
	// The engine restarts: its sequence starts over at 0.
	send(0, []Event{{Kind: KindStored, Hashes: []uint64{9}, Tokens: c, BlockSize: bs}})
	waitFor(t, "restart seen", func() bool { return strings.Contains(log.String(), "restart") && m.PeekMatchedTokens(c, bs, 0) == 4 })
	want := "complete(0,true) complete(0,false) complete(0,true) complete(0,false) restart(0,old=0) complete(0,true)"
	if got := log.String(); got != want {
		t.Fatalf("hooks: %s; want %s", got, want)
	}
	if !f.Complete() {
		t.Fatal("a restart at seq 0 is not complete")
	}
}

// A sequenced batch that does not decode whole is a gap: it may have removed blocks the mirror
// still holds, and replay would return the same bytes, so the rank is cleared, counted
// (gaps, lossy batches, a "decode" resync) and rebuilt from the batch's decodable events on,
// partial, never exact.
func TestFollowerLossyBatchIsGap(t *testing.T) {
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
	a, b, c := toks(1, 4), toks(20, 4), toks(40, 4)
	// seq 0 until the subscription takes (a clean start: complete).
	deadline := time.Now().Add(20 * time.Second)
	for m.PeekMatchedTokens(a, bs, 0) != 4 {
		if time.Now().After(deadline) {
			t.Fatal("nothing mirrored")
		}
		sendRaw(0, e.Encode(1, []Event{{Kind: KindCleared}, {Kind: KindStored, Hashes: []uint64{7}, Tokens: a, BlockSize: bs}}, 0))
		time.Sleep(10 * time.Millisecond)
	}
	waitFor(t, "complete", f.Complete)
	// seq 1 is not msgpack at all (0xc1 is never used).
	sendRaw(1, []byte{0xc1, 0x00})
	waitFor(t, "the undecodable batch clears the rank", func() bool {
		return m.PeekMatchedTokens(a, bs, 0) == 0 && !f.Complete() &&
			testutil.ToFloat64(f.met.lossy.WithLabelValues("0")) == 1 && testutil.ToFloat64(f.met.gaps.WithLabelValues("0")) == 1 &&
			testutil.ToFloat64(f.met.resyncs.WithLabelValues("0", "decode")) == 1
	})
	// seq 2 holds a malformed event (block_hashes a string) beside a good one: the good one is
	// kept on the cleared mirror.
	good := e.Encode(1, []Event{{Kind: KindStored, Hashes: []uint64{8}, Tokens: b, BlockSize: bs}}, 0)
	sendRaw(2, append([]byte(nil), good...))
	waitFor(t, "b mirrored", func() bool { return m.PeekMatchedTokens(b, bs, 0) == 4 })
	bad := enc(t, []any{1.0, []any{
		[]any{"BlockStored", "not-a-list", nil, []int{1, 2, 3, 4}, bs},
		[]any{"BlockStored", []uint64{9}, nil, []int{40, 41, 42, 43}, bs},
	}, 0})
	sendRaw(3, bad)
	waitFor(t, "the malformed event clears the rank, the good one applies", func() bool {
		return m.PeekMatchedTokens(b, bs, 0) == 0 && m.PeekMatchedTokens(c, bs, 0) == 4 &&
			testutil.ToFloat64(f.met.lossy.WithLabelValues("0")) == 2 && !f.Complete()
	})
}
