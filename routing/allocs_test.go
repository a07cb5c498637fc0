package routing

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/prefixmesh/prefixmesh/internal/testenv"
)

// TestAllocsEstimate backs the claim that an index estimate allocates nothing: a 512-block prompt
// against 16 nodes, each holding a different-length prefix of it plus blocks of its own.
func TestAllocsEstimate(t *testing.T) {
	testenv.SkipAllocsUnderRace(t)
	rng := rand.New(rand.NewPCG(1, 2))
	prompt := make([]uint64, 512)
	for i := range prompt {
		prompt[i] = rng.Uint64()
	}
	x := NewIndex(DefaultIndexConfig())
	var ids []string
	for n := range 16 {
		id := fmt.Sprintf("node-%02d", n)
		ids = append(ids, id)
		own := append([]uint64(nil), prompt[:n*len(prompt)/16]...)
		for range 1000 {
			own = append(own, rng.Uint64())
		}
		x.ReplaceNode(id, 1, 0, own)
	}
	got := make([]int, len(ids))
	if n := testing.AllocsPerRun(100, func() { x.Estimate(prompt, ids, got) }); n != 0 {
		t.Errorf("Estimate allocated %.1f times per call, want 0", n)
	}
	if got[15] != 15*len(prompt)/16 {
		t.Errorf("node-15 matched %d blocks, want %d", got[15], 15*len(prompt)/16)
	}
}
