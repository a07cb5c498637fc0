//go:build race

package simengine

// raceEnabled: the race detector's instrumentation allocates, so allocation tests skip under it.
const raceEnabled = true
