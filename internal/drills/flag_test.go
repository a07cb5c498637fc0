package drills

import (
	"slices"
	"testing"
)

// TestFirstByteFlagDetection pins how the SIGSTOP drill finds the router's first-byte deadline
// flags in `serve --help`: duration flags whose names contain "first-byte".
func TestFirstByteFlagDetection(t *testing.T) {
	for _, tc := range []struct {
		help string
		want []string
	}{
		{"Flags:\n  -drain-timeout duration\n    \ton SIGTERM\n  -first-byte-timeout duration\n    \tupstream\n", []string{"--first-byte-timeout=2s"}},
		{"  -first-byte-timeout-ceiling duration\n    \tlongest\n  -first-byte-timeout-floor duration\n    \tleast\n",
			[]string{"--first-byte-timeout-ceiling=2s", "--first-byte-timeout-floor=1s"}},
		{"  -first-byte-timeout int\n", nil}, // not a duration: not ours to set to 2s
		{"  -drain-timeout duration\n", nil},
	} {
		if got := firstByteArgs(tc.help); !slices.Equal(got, tc.want) {
			t.Errorf("%q: %q, want %q", tc.help, got, tc.want)
		}
	}
}
