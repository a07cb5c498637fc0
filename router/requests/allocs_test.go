package requests

import (
	"testing"

	"github.com/prefixmesh/prefixmesh/internal/testenv"
)

// TestAllocsPickDecisionFixed backs the claim that the front door's whole decision (hashing,
// index and overlay estimates, policy, in-flight and overlay bookkeeping, first token, done)
// makes a fixed number of allocations whatever the prompt's length: 1k and 16k tokens over 16
// nodes allocate the same count.
func TestAllocsPickDecisionFixed(t *testing.T) {
	testenv.SkipAllocsUnderRace(t)
	counts := map[int]float64{}
	for _, tokens := range []int{1024, 16384} {
		p, toks := stairPicker(t, 16, tokens)
		req := &PickRequest{Tokens: toks, Model: simModel}
		decide := func() {
			pk, err := p.Pick(t.Context(), req, nil)
			if err != nil {
				t.Fatal(err)
			}
			pk.FirstToken()
			pk.Done(Outcome{Status: 200})
		}
		for range 20 {
			decide()
		}
		counts[tokens] = testing.AllocsPerRun(50, decide)
	}
	if counts[1024] != counts[16384] {
		t.Errorf("a decision allocated %.1f times for 1k tokens and %.1f for 16k: allocations grow with the prompt", counts[1024], counts[16384])
	}
	if counts[16384] > 8 {
		t.Errorf("a decision allocated %.1f times, more than the 8 fixed-size allocations expected", counts[16384])
	}
}
