package kvpool

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Step is the mixed-batch step-time model: the time of one engine step (one forward pass of a
// continuous-batching engine) grows with the prefill tokens and the decode sequences it carries,
//
//	step = Fixed + PerPrefillToken × prefill tokens + PerDecodeSeq × decode sequences
//	            + PerContextToken × context tokens of the decode sequences,
//
// the linear step-latency model of DistServe (Zhong et al., OSDI'24: prefill latency
// linear in the batch's tokens, decode latency a near-constant plus a term per sequence) and
// Splitwise (Patel et al., ISCA'24: prompt phase compute-bound and linear in tokens, token
// phase memory-bound, its step barely growing with the batch). The fixed term is the weights'
// read that every forward pays; the per-token terms are the matmuls each scheduled token adds;
// the context term is attention reading the decode sequences' KV.
//
// An engine fills each step as vLLM's scheduler does (vllm/v1/core/sched/scheduler.py,
// schedule()): running requests first, in the order they were admitted, each taking the tokens
// it needs (one for a decoding sequence, the rest of its prompt for a prefilling one) up to what
// is left of the token budget, TokenBudget (vLLM's max_num_batched_tokens); then waiting requests
// are admitted while budget and sequence slots remain, the last of them taking a partial chunk
// (chunked prefill). So a long prompt prefills in chunks of at most TokenBudget tokens, one per
// step, and every decoding sequence on the node waits for the step that carries the chunk: a
// prefill slows the decode sequences sharing its steps, which is why prefill/decode
// disaggregation exists (DistServe's "prefill-decoding interference").
//
// How to adopt it in an engine model (the trace simulator, routing/sim's node.go, does this): keep
// the running sequences in admission order; at the start of a step give each decoding sequence
// one token and each prefilling one min(its remaining prompt, Budget left), admit waiting
// requests into what is left, then charge StepTime of the batch's prefill tokens, decode
// sequences and their context tokens. At the end of the step each decoding sequence has produced
// one token (its inter-token latency is the step's time), and a sequence whose last prompt chunk
// ran has produced its first token. A prefix-cache hit shortens a prompt's remaining tokens; vLLM
// always computes at least the last one (its logits give the first token), so a fully cached
// prompt still costs one token of a step.
//
// Steps and Costs agree on the first order: FromCosts derives a Step from Costs' rates so that a
// long prompt prefilled alone runs at Costs.PrefillTokensPerSec and a decode-only step of
// RefDecodeSeqs sequences produces Costs.DecodeTokensPerSec per sequence.
type Step struct {
	Fixed           time.Duration // paid by every step
	PerPrefillToken float64       // seconds per prefill token in the step
	PerDecodeSeq    float64       // seconds per decoding sequence in the step
	PerContextToken float64       // seconds per token of KV the decode sequences attend to
	// TokenBudget is the most tokens one step schedules (vLLM's max_num_batched_tokens), decode
	// sequences' tokens included.
	TokenBudget int
}

// DefaultTokenBudget is vLLM's max_num_batched_tokens for its OpenAI server on a GPU with 70 GiB
// or more other than an A100 (vllm/engine/arg_utils.py, the batch defaults: 8192; 2048 on smaller
// GPUs), the H100-class GPU the simulator's rates describe.
const DefaultTokenBudget = 8192

// RefDecodeSeqs is the decode batch at which FromCosts makes a decode-only step produce
// Costs.DecodeTokensPerSec per sequence: 16, a moderate batch, where the rate the simulator
// quotes ("a typical interactive per-stream speed at moderate batch sizes") is read.
const RefDecodeSeqs = 16

// ErrStep is returned, wrapped, for an unusable Step.
var ErrStep = errors.New("kvpool: invalid step model")

// FromCosts derives the step model from Costs' first-order rates, with the given token budget
// (DefaultTokenBudget when 0):
//
//   - PerPrefillToken = 1 / PrefillTokensPerSec: a long prompt, prefilled alone in full-budget
//     chunks, runs at the prefill rate (to within Fixed per chunk);
//   - PerDecodeSeq = PerPrefillToken: a decoding sequence is one more token through the same
//     weights (the batch's linear term counts tokens, as in DistServe's model);
//   - Fixed = 1/DecodeTokensPerSec − RefDecodeSeqs × PerDecodeSeq (at least 0): a decode-only
//     step of RefDecodeSeqs sequences takes 1/DecodeTokensPerSec;
//   - PerContextToken = 0: Costs' decode rate is quoted for the traces' contexts, attention
//     included; set it to model decode slowing with context length.
//
// With the simulator's defaults (10,000 prefill tokens/s, 50 decode tokens/s) that is 18.4 ms a
// step plus 0.1 ms a token: a decode-only step of 64 sequences takes 24.8 ms, and 837.6 ms when
// the 64 share it with a prompt chunk filling the rest of the budget (8,128 tokens): 34× the
// inter-token latency. A rate <= 0 leaves its terms 0.
func FromCosts(c Costs, budget int) Step {
	if budget <= 0 {
		budget = DefaultTokenBudget
	}
	s := Step{TokenBudget: budget}
	if c.PrefillTokensPerSec > 0 {
		s.PerPrefillToken = 1 / c.PrefillTokensPerSec
		s.PerDecodeSeq = s.PerPrefillToken
	}
	if c.DecodeTokensPerSec > 0 {
		fixed := 1/c.DecodeTokensPerSec - RefDecodeSeqs*s.PerDecodeSeq
		s.Fixed = time.Duration(math.Max(fixed, 0) * float64(time.Second))
	}
	return s
}

// Validate reports whether s is usable: non-negative, finite terms and a positive budget.
func (s Step) Validate() error {
	for _, v := range []float64{s.PerPrefillToken, s.PerDecodeSeq, s.PerContextToken} {
		if !(v >= 0) || math.IsInf(v, 1) {
			return fmt.Errorf("%w: per-token terms %v, %v, %v must be non-negative and finite", ErrStep, s.PerPrefillToken, s.PerDecodeSeq, s.PerContextToken)
		}
	}
	if s.Fixed < 0 || s.TokenBudget <= 0 {
		return fmt.Errorf("%w: fixed %v must not be negative, token budget %d must be positive", ErrStep, s.Fixed, s.TokenBudget)
	}
	return nil
}

// StepTime is the time of one step carrying prefillTokens prompt tokens and decodeSeqs decoding
// sequences whose KV holds contextTokens tokens in all. An empty step takes no time.
func (s Step) StepTime(prefillTokens, decodeSeqs, contextTokens int) time.Duration {
	prefillTokens, decodeSeqs, contextTokens = max(prefillTokens, 0), max(decodeSeqs, 0), max(contextTokens, 0)
	if prefillTokens == 0 && decodeSeqs == 0 {
		return 0
	}
	sec := s.PerPrefillToken*float64(prefillTokens) + s.PerDecodeSeq*float64(decodeSeqs) + s.PerContextToken*float64(contextTokens)
	return s.Fixed + time.Duration(sec*float64(time.Second))
}

// PrefillAlone is the time to prefill tokens prompt tokens on an otherwise idle engine: chunks of
// at most TokenBudget tokens, one step each (at least one token: the last is always computed).
func (s Step) PrefillAlone(tokens int) time.Duration {
	tokens = max(tokens, 1)
	budget := max(s.TokenBudget, 1)
	full, rest := tokens/budget, tokens%budget
	d := time.Duration(full) * s.StepTime(budget, 0, 0)
	if rest > 0 {
		d += s.StepTime(rest, 0, 0)
	}
	return d
}

// Batch is one step being filled, the scheduling both simulated engines share: the running
// sequences in admission order, then admissions, as vLLM's scheduler fills a step
// (vllm/v1/core/sched/scheduler.py: running requests first, then waiting ones), each taking what
// it needs of the token budget: one token for a decoding sequence, the rest of its prompt up to
// what is left for a prefilling one.
type Batch struct {
	left                     int
	Prefill, Decode, Context int // the step's prompt tokens, decoding sequences and their KV
}

// NewBatch starts a step under s's token budget.
func (s Step) NewBatch() Batch { return Batch{left: s.TokenBudget} }

// Full reports whether the budget is spent.
func (b *Batch) Full() bool { return b.left <= 0 }

// AddDecode schedules a decoding sequence whose KV holds context tokens: one token of the
// budget. False when the budget is spent (the sequence waits for the next step).
func (b *Batch) AddDecode(context int) bool {
	if b.left <= 0 {
		return false
	}
	b.left--
	b.Decode++
	b.Context += max(context, 0)
	return true
}

// AddPrefill schedules the next chunk of a prompt with remaining tokens to compute and returns
// the chunk's tokens: all of them, or what is left of the budget (0 when it is spent).
func (b *Batch) AddPrefill(remaining int) int {
	k := min(max(remaining, 0), max(b.left, 0))
	b.left -= k
	b.Prefill += k
	return k
}

// Time is the step's time under s.
func (s Step) Time(b *Batch) time.Duration { return s.StepTime(b.Prefill, b.Decode, b.Context) }
