//go:build race

package router

// raceEnabled: the race detector drops sync.Pool entries at random, so allocation counts differ.
const raceEnabled = true
