package kvevents

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"
)

// Restored copies are provisional: the engine storing a block again confirms its copy (it is not
// a second one), so a block the engine evicted while the agent was down is right again as soon
// as the engine recomputes it.
func TestCheckpointProvisionalCopies(t *testing.T) {
	const bs = 4
	m := NewCacheMirror(bs)
	a := toks(1, 8)
	m.Apply(0, &Event{Kind: KindStored, Hashes: []uint64{10, 11}, Tokens: a, BlockSize: bs})
	r, _, err := ReadCheckpoint(bytes.NewReader(m.AppendCheckpoint(nil, 1, 0)), bs, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.PeekMatchedTokens(a, bs, 0); got != 8 || r.MirrorStats().Provisional != 2 {
		t.Fatalf("restored: peek %d, provisional %d", got, r.MirrorStats().Provisional)
	}
	// The engine had evicted block 11 and stores it again: one copy, confirmed.
	r.Apply(0, &Event{Kind: KindStored, Hashes: []uint64{11}, Parent: 10, HasParent: true, Tokens: a[4:], BlockSize: bs})
	if s := r.MirrorStats(); s.Provisional != 1 || s.Tiers[TierGPU] != 2 {
		t.Fatalf("after the re-store: %+v", s)
	}
	r.Apply(0, &Event{Kind: KindRemoved, Hashes: []uint64{11}})
	if got := r.PeekMatchedTokens(a, bs, 0); got != 4 {
		t.Fatalf("after its removal: peek %d, want 4", got)
	}
	if err := r.check(); err != nil {
		t.Fatal(err)
	}
}

// A checkpoint that is truncated anywhere, or written for another block size or rank count, is
// refused with ErrCheckpoint, never a panic.
func TestCheckpointRefusesBadFiles(t *testing.T) {
	const bs = 4
	m := NewCacheMirror(bs)
	m.Apply(0, &Event{Kind: KindStored, Hashes: []uint64{10, 11}, Tokens: toks(1, 8), BlockSize: bs})
	m.Apply(0, &Event{Kind: KindStored, Hashes: []uint64{20}, Parent: 99, HasParent: true, Tokens: toks(50, 4), BlockSize: bs})
	ck := m.AppendCheckpoint(nil, 1, 0)
	for n := 0; n < len(ck); n++ {
		if _, _, err := ReadCheckpoint(bytes.NewReader(ck[:n]), bs, 1); !errors.Is(err, ErrCheckpoint) {
			t.Fatalf("truncated at %d: %v", n, err)
		}
	}
	if _, _, err := ReadCheckpoint(bytes.NewReader(ck), 16, 1); !errors.Is(err, ErrCheckpoint) {
		t.Fatalf("another block size: %v", err)
	}
	if _, _, err := ReadCheckpoint(bytes.NewReader(ck), bs, 2); !errors.Is(err, ErrCheckpoint) {
		t.Fatalf("another rank count: %v", err)
	}
	r, _, err := ReadCheckpoint(bytes.NewReader(ck), bs, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.check(); err != nil || r.MirrorStats().Orphans != 1 {
		t.Fatalf("restored with an orphan: %v %+v", err, r.MirrorStats())
	}
}

// restoreRun mirrors pub from its first batch with a follower, checkpoints it, closes it, lets
// between run (the engine going on while the agent is down) and starts a new follower from the
// checkpoint. It returns the new mirror and follower.
func restoreRun(t *testing.T, ctx context.Context, pub *Publisher, withReplay bool, first []Event, between func()) (*CacheMirror, *Follower) {
	t.Helper()
	const bs = 4
	m := NewCacheMirror(bs)
	cfg := DefaultConfig()
	cfg.Endpoint = pub.Addr()
	if withReplay {
		cfg.Replay = pub.ReplayAddr()
	}
	cfg.RedialInterval = 20 * time.Millisecond
	f, err := NewFollower(cfg, m, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	f.Start(ctx)
	waitFor(t, "connected", f.Connected)
	// Until the subscription takes, batches are lost; without replay, an AllBlocksCleared in
	// each gives the first one that lands a clean (exact) baseline.
	deadline := time.Now().Add(20 * time.Second)
	for !f.Complete() || m.PeekMatchedTokens(first[len(first)-1].Tokens, bs, 0) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("nothing mirrored")
		}
		pub.Publish(1, append([]Event{{Kind: KindCleared}}, first...))
		time.Sleep(20 * time.Millisecond)
	}
	ckpt := m.AppendCheckpoint(nil, 1, 0)
	f.Close()
	between()
	m2, ck, err := ReadCheckpoint(bytes.NewReader(ckpt), bs, 1)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Restore = &ck
	f2, err := NewFollower(cfg, m2, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !f2.Cold() {
		t.Fatal("a restored rank is not cold before it is verified")
	}
	f2.Start(ctx)
	t.Cleanup(f2.Close)
	return m2, f2
}

// After an agent restart with a checkpoint and a replay socket, the gap is replayed: the mirror
// is exact again (what the engine removed meanwhile is gone, what it stored is there), its
// copies confirmed, and the rank is not cold.
func TestFollowerRestoreReplaysGap(t *testing.T) {
	const bs = 4
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pc := DefaultPublisherConfig()
	pc.Endpoint, pc.Replay = "tcp://127.0.0.1:0", "tcp://127.0.0.1:0"
	pub, err := NewPublisher(ctx, pc, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	a, b, c := toks(1, 4), toks(20, 4), toks(40, 4)
	m, f := restoreRun(t, ctx, pub, true, []Event{
		{Kind: KindStored, Hashes: []uint64{1}, Tokens: a, BlockSize: bs},
		{Kind: KindStored, Hashes: []uint64{2}, Tokens: b, BlockSize: bs},
	}, func() {
		pub.Publish(2, []Event{{Kind: KindRemoved, Hashes: []uint64{2}}})
		pub.Publish(3, []Event{{Kind: KindStored, Hashes: []uint64{3}, Tokens: c, BlockSize: bs}})
	})
	waitFor(t, "the gap replayed", func() bool {
		return !f.Cold() && f.Complete() && m.PeekMatchedTokens(a, bs, 0) == 4 && m.PeekMatchedTokens(b, bs, 0) == 0 &&
			m.PeekMatchedTokens(c, bs, 0) == 4 && m.MirrorStats().Provisional == 0
	})
}

// Without a replay socket the restored mirror is partial: credited, not cold, its copies
// provisional, and it goes on with the next live batch (no clear for the gap).
func TestFollowerRestoreWithoutReplay(t *testing.T) {
	const bs = 4
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pc := DefaultPublisherConfig()
	pc.Endpoint = "tcp://127.0.0.1:0"
	pub, err := NewPublisher(ctx, pc, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	a, c := toks(1, 4), toks(40, 4)
	m, f := restoreRun(t, ctx, pub, false, []Event{{Kind: KindStored, Hashes: []uint64{1}, Tokens: a, BlockSize: bs}},
		func() {
			pub.Publish(2, []Event{{Kind: KindStored, Hashes: []uint64{9}, Tokens: toks(90, 4), BlockSize: bs}})
		})
	waitFor(t, "restored, partial, warm", func() bool {
		return !f.Cold() && !f.Complete() && m.PeekMatchedTokens(a, bs, 0) == 4 && m.MirrorStats().Provisional == 1
	})
	deadline := time.Now().Add(20 * time.Second)
	for m.PeekMatchedTokens(c, bs, 0) != 4 { // the next live batch lands on the restored mirror
		if time.Now().After(deadline) {
			t.Fatal("the live batch after the gap never applied")
		}
		pub.Publish(3, []Event{{Kind: KindStored, Hashes: []uint64{3}, Tokens: c, BlockSize: bs}})
		time.Sleep(20 * time.Millisecond)
	}
	if m.PeekMatchedTokens(a, bs, 0) != 4 {
		t.Fatal("the gap cleared the restored mirror")
	}
}

// An engine that restarted while the agent was down (its replay buffer no longer holds the
// checkpoint's last batch and starts below it) drops the checkpoint.
func TestFollowerRestoreEngineRestarted(t *testing.T) {
	const bs = 4
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	port, rport := freePorts(t, 1), freePorts(t, 1)
	start := func() *Publisher {
		pc := DefaultPublisherConfig()
		pc.Endpoint, pc.Replay = "tcp://127.0.0.1:"+itoa(port), "tcp://127.0.0.1:"+itoa(rport)
		var p *Publisher
		var err error
		for try := 0; try < 100; try++ {
			if p, err = NewPublisher(ctx, pc, nil); err == nil {
				return p
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatal(err)
		return nil
	}
	old := start()
	a := toks(1, 4)
	var restarted *Publisher
	m, f := restoreRun(t, ctx, old, true, []Event{{Kind: KindStored, Hashes: []uint64{1}, Tokens: a, BlockSize: bs}}, func() {
		for i := 0; i < 3; i++ { // move the checkpoint past seq 0
			old.Publish(2, []Event{{Kind: KindStored, Hashes: []uint64{uint64(50 + i)}, Tokens: toks(50+4*i, 4), BlockSize: bs}})
		}
		old.Close()
		restarted = start()
	})
	defer restarted.Close()
	waitFor(t, "the checkpoint dropped", func() bool {
		return !f.Cold() && m.PeekMatchedTokens(a, bs, 0) == 0 && m.MirrorStats().Blocks == 0
	})
}
