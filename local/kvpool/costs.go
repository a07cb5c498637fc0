package kvpool

import "time"

// Costs are the simulated engines' rates, shared by the live simulated engine and the trace
// simulator: prompt tokens computed per second, output tokens one sequence produces per second
// alone, and tokens loaded from a CPU tier per second; a rate <= 0 makes that work free. Both
// engines run in steps whose time comes from these rates (FromCosts, Step): a step that carries
// prompt chunks beside decoding sequences is longer for all of them, as in vLLM's chunked
// prefill. PrefillTime, DecodeTime and LoadTime are the first-order times of each kind of work
// alone (what a prompt costs with nothing beside it, the prior a router starts from). CPU-tier
// loads run on one host-to-GPU lane per engine, outside the steps.
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
