//go:build race

package local

// raceEnabled scales the model test down under the race detector, which slows it about tenfold;
// the normal run keeps the full operation budget.
const raceEnabled = true
