package local

import "testing"

// The finaliser's outputs for SplitMix64's first states from seed 0 (state = k·0x9e3779b97f4a7c15):
// the sequence every SplitMix64 implementation produces, e.g. Vigna's splitmix64.c, whose first
// outputs from seed 0 are e220a8397b1dcdaf, 6e789e6aa1b965f4, 06c45d188009454f.
func TestMix64MatchesSplitMix64(t *testing.T) {
	const gamma = 0x9e3779b97f4a7c15
	for k, want := range []uint64{0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4, 0x06c45d188009454f} {
		if got := Mix64(uint64(k+1) * gamma); got != want {
			t.Errorf("output %d: %#x, want %#x", k, got, want)
		}
	}
}
