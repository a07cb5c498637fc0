package openai

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
)

// Arrays of token ids in the shapes encoders write and in shapes near them that are not plain
// or not JSON: whatever ParseIDs accepts is what encoding/json reads, and it accepts every array
// of ids in range that encoding/json reads.
func TestParseIDsShapes(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	seps := []string{",", ", ", ",  ", " ,", ",\n", ",,", ", ,"}
	for round := range 4000 {
		var sb strings.Builder
		sb.WriteByte('[')
		n := 1 + rng.IntN(300)
		plainSep := seps[rng.IntN(2)]
		for i := range n {
			if i > 0 {
				sep := plainSep
				if rng.IntN(200) == 0 {
					sep = seps[rng.IntN(len(seps))]
				}
				sb.WriteString(sep)
			}
			switch r := rng.IntN(400); {
			case r == 0:
				sb.WriteString("0")
			case r == 1:
				sb.WriteString("0" + strconv.Itoa(rng.IntN(1000))) // a leading zero: not JSON
			case r == 2:
				sb.WriteString(strconv.FormatUint(uint64(rng.Uint32())+rng.Uint64N(2)<<32, 10)) // 8 to 11 digits, some over the range
			case r == 3:
				sb.WriteString("-1")
			case r == 4:
				sb.WriteString("12.0")
			default:
				sb.WriteString(strconv.Itoa(rng.IntN([]int{10, 1000, 200000, 10000000}[rng.IntN(4)])))
			}
		}
		sb.WriteString([]string{"]", " ]", "]"}[rng.IntN(3)])
		raw := []byte(sb.String())
		got, err := ParseIDs(raw, "prompt")
		var want []float64
		jerr := json.Unmarshal(raw, &want)
		inRange := jerr == nil && len(want) > 0
		for _, f := range want {
			if f < 0 || f > maxIDValue || f != math.Trunc(f) {
				inRange = false
			}
		}
		switch {
		case err == nil && !inRange:
			t.Fatalf("round %d: accepted %q, encoding/json reads %v (%v)", round, raw, want, jerr)
		case err != nil && inRange:
			t.Fatalf("round %d: refused %q (%v), encoding/json reads %d ids", round, raw, err, len(want))
		case err == nil:
			if len(got) != len(want) {
				t.Fatalf("round %d: %d ids, encoding/json reads %d", round, len(got), len(want))
			}
			for i := range got {
				if float64(got[i]) != want[i] {
					t.Fatalf("round %d: id %d = %d, encoding/json reads %v in %q", round, i, got[i], want[i], raw)
				}
			}
		}
		ReleaseIDs(got)
	}
}
