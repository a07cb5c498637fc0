//go:build race

package kvpool

// raceEnabled: the race detector's instrumentation allocates, so allocation tests skip under it.
const raceEnabled = true
