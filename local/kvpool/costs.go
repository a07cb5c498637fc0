package kvpool

import "time"

// Costs is the simulated engine's cost model, shared by the live simulated engine and the trace
// simulator so both charge the same time for the same work. Prefill is charged per uncached
// prompt token (cached tokens cost nothing: their KV is reused) and decode per output token, each
// at a constant rate; a rate <= 0 makes that phase free. The model ignores batching effects on
// purpose: it is the first-order cost that prefix routing saves, and it keeps the live engine and
// the simulator trivially in agreement. The simulated engine emits the first output token when
// prefill ends (the prefill's forward pass yields it) and token i (0-based) at prefill end +
// DecodeTime(i); it releases the sequence after the last one.
//
// With a CPU tier, tokens loaded from it back into the GPU cost LoadTime, charged on the prefill
// lane before the uncached remainder is prefilled (a first-order cost: vLLM overlaps the DMA with
// other requests' compute, which this, like the prefill model, ignores).
type Costs struct {
	PrefillTokensPerSec float64 // prompt tokens computed per second
	DecodeTokensPerSec  float64 // output tokens produced per second by one sequence
	LoadTokensPerSec    float64 // tokens loaded from the CPU tier per second
}

// PrefillTime is the time to compute uncachedTokens prompt tokens.
func (c Costs) PrefillTime(uncachedTokens int) time.Duration {
	return perRate(uncachedTokens, c.PrefillTokensPerSec)
}

// DecodeTime is the time one sequence takes to produce outputTokens tokens.
func (c Costs) DecodeTime(outputTokens int) time.Duration {
	return perRate(outputTokens, c.DecodeTokensPerSec)
}

// LoadTime is the time to load tokens from the CPU tier into the GPU.
func (c Costs) LoadTime(tokens int) time.Duration {
	return perRate(tokens, c.LoadTokensPerSec)
}

func perRate(n int, rate float64) time.Duration {
	if n <= 0 || rate <= 0 {
		return 0
	}
	return time.Duration(float64(n) / rate * float64(time.Second))
}
