package openai

import (
	"encoding/binary"
	"math/rand/v2"
	"strconv"
	"testing"
)

// swarDigits against strconv on every digit-run length, with every kind of byte after the run.
func TestSwarDigits(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	followers := []byte{',', ']', ' ', '.', 'e', '"', 0, 0xFF, '/', ':', 0x30 + 10, 0xFA}
	for n := 1; n <= 8; n++ {
		for range 2000 {
			digits := make([]byte, n)
			for i := range digits {
				digits[i] = byte('0' + rng.IntN(10))
			}
			buf := append(append([]byte{}, digits...), make([]byte, 8)...)
			for i := n; i < 8; i++ {
				buf[i] = followers[rng.IntN(len(followers))]
			}
			v, got := swarDigits(binary.LittleEndian.Uint64(buf))
			if got != n {
				t.Fatalf("%q: run length %d, want %d", buf[:8], got, n)
			}
			if got7 := digitRun7(binary.LittleEndian.Uint64(buf)); got7 != min(n, 7) {
				t.Fatalf("%q: digitRun7 %d, want %d", buf[:8], got7, min(n, 7))
			}
			if n < 8 {
				want, _ := strconv.ParseUint(string(digits), 10, 64)
				if uint64(v) != want {
					t.Fatalf("%q: value %d, want %d", buf[:8], v, want)
				}
			}
		}
	}
	if _, n := swarDigits(binary.LittleEndian.Uint64([]byte(",1234567"))); n != 0 {
		t.Errorf("a leading non-digit gave run length %d", n)
	}
}
