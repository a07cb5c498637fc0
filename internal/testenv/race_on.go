//go:build race

package testenv

// Race is true when the race detector is on: it drops sync.Pool entries at random and
// instruments memory, so allocation counts mean nothing and allocation tests skip under it
// (scripts/test.sh runs them again without it).
const Race = true
