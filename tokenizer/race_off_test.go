//go:build !race

package tokenizer

// raceEnabled: see race_on_test.go.
const raceEnabled = false
