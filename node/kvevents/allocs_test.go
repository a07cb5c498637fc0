package kvevents

import (
	"context"
	"testing"
	"time"

	"github.com/prefixmesh/prefixmesh/internal/testenv"
)

// TestAllocsDecodeApply backs the claim that decoding and applying KV events allocates nothing in
// steady state: the benchmark's busy engine step (32 prompts of 32 blocks stored, then evicted),
// in every layout and hash encoding, after the journal ring and maps have reached their size.
func TestAllocsDecodeApply(t *testing.T) {
	testenv.SkipAllocsUnderRace(t)
	for _, c := range []struct {
		name   string
		layout Layout
		hashes HashFormat
	}{{"map-int", LayoutMap, HashInt}, {"array-int", LayoutArray, HashInt}, {"map-bytes", LayoutMap, HashBytes}} {
		store, remove, _ := benchBatches(c.layout, c.hashes)
		d := NewDecoder()
		m := NewCacheMirror(16)
		rootBlock(m)
		seq := uint64(0)
		run := func() {
			for _, p := range [][]byte{store, remove} {
				seq++
				bt, err := d.Decode(seq, p)
				if err != nil {
					t.Fatal(err)
				}
				for j := range bt.Events {
					m.Apply(0, &bt.Events[j])
				}
			}
		}
		for range 64 {
			run()
		}
		if n := testing.AllocsPerRun(50, run); n != 0 {
			t.Errorf("%s: decode+apply of one store and one removal batch allocated %.1f times, want 0", c.name, n)
		}
	}
}

// followerHotPath is a follower whose rank 0 has applied a first batch: the rank machine and
// the driver's executor, with no sockets, for the in-order live path.
func followerHotPath(t testing.TB) (live func(seq uint64, payload []byte), store, remove []byte) {
	store, remove, _ = benchBatches(LayoutMap, HashInt)
	m := NewCacheMirror(16)
	rootBlock(m)
	f, err := NewFollower(DefaultConfig(), m, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	rs := f.ranks[0]
	rs.idle = time.NewTimer(time.Hour)
	t.Cleanup(func() { rs.idle.Stop() })
	ctx := context.Background()
	live = func(seq uint64, payload []byte) { f.run(ctx, rs, rs.m.Live(seq, payload, time.Now())) }
	live(0, store)
	return live, store, remove
}

// TestAllocsFollowerLive: the follower's whole in-order path (the rank machine's transition,
// decode, apply, metrics, the recorded position, the idle timer) allocates nothing either.
func TestAllocsFollowerLive(t *testing.T) {
	testenv.SkipAllocsUnderRace(t)
	live, store, remove := followerHotPath(t)
	seq := uint64(0)
	run := func() {
		for _, p := range [][]byte{remove, store} {
			seq++
			live(seq, p)
		}
	}
	for range 64 {
		run()
	}
	if n := testing.AllocsPerRun(50, run); n != 0 {
		t.Errorf("the follower's live path over one removal and one store batch allocated %.1f times, want 0", n)
	}
}

// TestAllocsDecodeApplyCPU: decoding and applying vLLM's self-describing CPU offload events
// (BenchmarkDecodeApplyTiers' step: CPU chunks over blocks held on the GPU, and their fanned-out
// removals) allocates nothing in steady state either, the follower's Expire included.
func TestAllocsDecodeApplyCPU(t *testing.T) {
	testenv.SkipAllocsUnderRace(t)
	gpu, store, remove, _ := cpuBenchBatches()
	d := NewDecoder()
	m := NewCacheMirror(16)
	rootBlock(m)
	tierBenchRun(t, d, m, gpu, nil)()
	run := tierBenchRun(t, d, m, store, remove)
	for range 64 {
		run()
	}
	if n := testing.AllocsPerRun(50, run); n != 0 {
		t.Errorf("decode+apply of one CPU store and one CPU removal batch allocated %.1f times, want 0", n)
	}
	if s := m.MirrorStats(); s.Tiers[TierCPU] != 0 || s.Visible != 1+32*32 || s.Underrun != 0 || s.Unknown != 0 {
		t.Fatalf("after store and removal rounds: %+v", s)
	}
}
