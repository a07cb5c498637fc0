package openai

import (
	"encoding/json"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
)

// Long id arrays whose separator changes every few ids (Go's ",", Python's ", ", and spacing
// the rounds do not take) and whose ids run from 1 to 8 digits, so that the four-id rounds stop
// and resume at every offset of their window: ParseIDs reads what encoding/json reads.
func TestIDRoundsAgreeWithEncodingJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	seps := []string{",", ", ", ",  ", " ,", ",\n"}
	for round := range 3000 {
		var sb strings.Builder
		sb.WriteByte('[')
		n := 1 + rng.IntN(120)
		sep := seps[rng.IntN(2)]
		want := make([]uint32, n)
		for i := range n {
			if i > 0 {
				if rng.IntN(6) == 0 {
					sep = seps[rng.IntN(len(seps))]
				}
				sb.WriteString(sep)
			}
			digits := 1 + rng.IntN(8)
			v := rng.Uint64N(pow10(digits))
			if digits > 1 {
				v = pow10(digits-1) + v%(pow10(digits)-pow10(digits-1)) // no leading zero
			}
			v %= 1 << 32
			want[i] = uint32(v)
			sb.WriteString(strconv.FormatUint(v, 10))
		}
		sb.WriteString([]string{"]", " ]"}[rng.IntN(2)])
		raw := []byte(sb.String())
		var ref []uint32
		if err := json.Unmarshal(raw, &ref); err != nil {
			t.Fatalf("round %d: encoding/json refuses %q: %v", round, raw, err)
		}
		got, err := ParseIDs(raw, "prompt")
		if err != nil {
			t.Fatalf("round %d: %q: %v", round, raw, err)
		}
		if len(got) != len(ref) {
			t.Fatalf("round %d: %d ids, encoding/json reads %d in %q", round, len(got), len(ref), raw)
		}
		for i := range got {
			if got[i] != ref[i] {
				t.Fatalf("round %d: id %d = %d, encoding/json reads %d in %q", round, i, got[i], ref[i], raw)
			}
		}
		ReleaseIDs(got)
	}
}

func pow10(n int) uint64 {
	p := uint64(1)
	for range n {
		p *= 10
	}
	return p
}
