//go:build !race

package testenv

// Race is false without the race detector (see race_on.go).
const Race = false
