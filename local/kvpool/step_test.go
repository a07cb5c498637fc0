package kvpool

import (
	"errors"
	"math"
	"testing"
	"time"
)

// The simulator's default rates (10,000 prefill tokens/s, 50 decode tokens/s per sequence) give,
// by hand: PerPrefillToken = PerDecodeSeq = 1/10,000 s = 100 µs; Fixed = 1/50 s − 16 × 100 µs =
// 20 ms − 1.6 ms = 18.4 ms.
func TestFromCostsDefaults(t *testing.T) {
	s := FromCosts(Costs{PrefillTokensPerSec: 10000, DecodeTokensPerSec: 50}, 0)
	if s.Fixed != 18400*time.Microsecond || s.TokenBudget != 8192 || s.PerContextToken != 0 {
		t.Fatalf("step %+v: want 18.4 ms fixed, budget 8192, no context term", s)
	}
	if math.Abs(s.PerPrefillToken-100e-6) > 1e-15 || math.Abs(s.PerDecodeSeq-100e-6) > 1e-15 {
		t.Fatalf("per token %v, per sequence %v: want 100 µs each", s.PerPrefillToken, s.PerDecodeSeq)
	}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestStepTime(t *testing.T) {
	s := Step{Fixed: 10 * time.Millisecond, PerPrefillToken: 1e-4, PerDecodeSeq: 2e-4, PerContextToken: 1e-7, TokenBudget: 2048}
	for _, c := range []struct {
		prefill, decode, ctx int
		want                 time.Duration
	}{
		{0, 0, 0, 0},    // nothing scheduled: no step
		{0, 0, 5000, 0}, // context without a sequence is not a step
		{1, 0, 0, 10*time.Millisecond + 100*time.Microsecond},
		{0, 16, 0, 10*time.Millisecond + 3200*time.Microsecond},                            // 16 × 0.2 ms
		{0, 16, 160000, 10*time.Millisecond + 3200*time.Microsecond + 16*time.Millisecond}, // + 160k × 0.1 µs
		{2000, 48, 0, 10*time.Millisecond + 200*time.Millisecond + 9600*time.Microsecond},
		{-5, -1, -9, 0}, // negative counts are none
	} {
		got := s.StepTime(c.prefill, c.decode, c.ctx)
		if d := got - c.want; d < -time.Nanosecond || d > time.Nanosecond {
			t.Errorf("StepTime(%d, %d, %d) = %v, want %v", c.prefill, c.decode, c.ctx, got, c.want)
		}
	}
}

// A decode-only step at RefDecodeSeqs sequences produces the Costs decode rate per sequence; the
// defaults' interference figures quoted in FromCosts' comment hold.
func TestFromCostsCalibration(t *testing.T) {
	s := FromCosts(Costs{PrefillTokensPerSec: 10000, DecodeTokensPerSec: 50}, 0)
	if got := s.StepTime(0, RefDecodeSeqs, 0); got != 20*time.Millisecond {
		t.Fatalf("decode step at the reference batch %v, want 20 ms (50 tokens/s)", got)
	}
	if got := s.StepTime(0, 64, 0); got != 24800*time.Microsecond {
		t.Fatalf("decode step of 64 %v, want 24.8 ms", got)
	}
	if got := s.StepTime(8192-64, 64, 0); got != 837600*time.Microsecond {
		t.Fatalf("mixed step %v, want 837.6 ms", got)
	}
	// A rate too slow for the reference batch clamps the fixed term at 0.
	if z := FromCosts(Costs{PrefillTokensPerSec: 100, DecodeTokensPerSec: 50}, 0); z.Fixed != 0 {
		t.Fatalf("fixed %v, want 0 (16 × 10 ms exceeds 20 ms)", z.Fixed)
	}
	// No rates, no terms: every step is free.
	if z := FromCosts(Costs{}, 512); z.StepTime(100, 10, 0) != 0 || z.TokenBudget != 512 {
		t.Fatalf("free model %+v", z)
	}
}

// 20,000 tokens alone in 8,192-token chunks: two full steps (18.4 + 819.2 ms each) and one of
// 3,616 tokens (18.4 + 361.6 ms) = 2,055.2 ms; one cached-through prompt still costs one token.
func TestPrefillAlone(t *testing.T) {
	s := FromCosts(Costs{PrefillTokensPerSec: 10000, DecodeTokensPerSec: 50}, 0)
	if got := s.PrefillAlone(20000); got != 2055200*time.Microsecond {
		t.Fatalf("PrefillAlone(20000) = %v, want 2.0552 s", got)
	}
	if got := s.PrefillAlone(8192); got != 837600*time.Microsecond {
		t.Fatalf("PrefillAlone(8192) = %v, want 837.6 ms", got)
	}
	if got := s.PrefillAlone(0); got != 18500*time.Microsecond {
		t.Fatalf("PrefillAlone(0) = %v, want one token: 18.5 ms", got)
	}
}

func TestStepValidate(t *testing.T) {
	good := Step{Fixed: time.Millisecond, PerPrefillToken: 1e-4, TokenBudget: 1}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []Step{
		{TokenBudget: 0},
		{TokenBudget: 8, Fixed: -1},
		{TokenBudget: 8, PerPrefillToken: -1e-4},
		{TokenBudget: 8, PerDecodeSeq: math.NaN()},
		{TokenBudget: 8, PerContextToken: math.Inf(1)},
	} {
		if err := bad.Validate(); !errors.Is(err, ErrStep) {
			t.Errorf("%+v: %v, want ErrStep", bad, err)
		}
	}
}

// A step filled as vLLM fills it: budget 10; two decoding sequences take a token each (KV of 100
// and 50), a prompt with 6 left takes 6, the next prompt gets the 2 left, and nothing more fits.
// Its time: 2 decode sequences, 8 prompt tokens, 150 tokens of KV.
func TestBatchFillsTheBudget(t *testing.T) {
	s := Step{Fixed: time.Millisecond, PerPrefillToken: 0.001, PerDecodeSeq: 0.002, PerContextToken: 0.0001, TokenBudget: 10}
	b := s.NewBatch()
	if !b.AddDecode(100) || !b.AddDecode(50) {
		t.Fatal("decode refused with budget left")
	}
	if k := b.AddPrefill(6); k != 6 {
		t.Fatalf("first chunk %d, want 6", k)
	}
	if k := b.AddPrefill(500); k != 2 || !b.Full() {
		t.Fatalf("second chunk %d (full %v), want the 2 left", k, b.Full())
	}
	if b.AddDecode(10) || b.AddPrefill(5) != 0 {
		t.Fatal("a full step took more")
	}
	want := time.Millisecond + time.Duration((8*0.001+2*0.002+150*0.0001)*float64(time.Second))
	if b.Prefill != 8 || b.Decode != 2 || b.Context != 150 || s.Time(&b) != want {
		t.Fatalf("batch %+v time %v, want 8 prompt tokens, 2 decodes, 150 KV, %v", b, s.Time(&b), want)
	}
}
