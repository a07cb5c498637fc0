//go:build race

package cluster

// raceEnabled shrinks the randomized tests under the race detector, which slows the cluster's
// dozens of goroutines (and so every timer-driven step) by an order of magnitude.
const raceEnabled = true
