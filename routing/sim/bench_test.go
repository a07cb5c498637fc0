package sim

import (
	"os"
	"testing"

	"github.com/prefixmesh/prefixmesh/routing"
)

// BenchmarkRunStandardTrace replays the first 1,000 requests of the standard trace through the
// default policy on the standard fleet (one op = one whole run), and the pooled reference beside
// it as the baseline: both drive the same tree and pool, so their ratio is the simulator's own
// overhead (routing, index, events). `go test -bench Run -benchmem -cpuprofile cpu.out` shows
// where the time goes.
func BenchmarkRunStandardTrace(b *testing.B) {
	f, err := os.Open("../../data/traces/synthetic_trace.jsonl")
	if err != nil {
		b.Fatalf("standard trace (shipped in data/traces): %v", err)
	}
	tr, err := ReadMooncake(f, ReadOptions{Limit: 1000})
	f.Close()
	if err != nil {
		b.Fatal(err)
	}
	cfg := DefaultConfig()
	b.Run("prefixmesh", func(b *testing.B) {
		for b.Loop() {
			if _, err := Run(tr, routing.PolicyPrefixMesh, cfg); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("pooled-reference", func(b *testing.B) {
		for b.Loop() {
			if _, err := References(tr, cfg); err != nil {
				b.Fatal(err)
			}
		}
	})
}
