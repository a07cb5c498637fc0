//go:build !race

package simengine

const raceEnabled = false
