//go:build race

package tokenizer

// raceEnabled: the race detector slows the encoder about tenfold; the code-point sweep then
// checks a subset of its blocks (sweep_test.go).
const raceEnabled = true
