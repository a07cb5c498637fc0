package kvevents

import (
	"testing"

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
		m := NewMirror(16)
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
