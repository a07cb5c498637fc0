//go:build !race

package kvpool

const raceEnabled = false
