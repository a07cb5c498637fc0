package tokenizer

import (
	"errors"
	"strings"
	"testing"
)

// TestSpellUnicodeClasses: General_Category properties and \d follow Unicode 16.0.0 (U+1CCF0,
// OUTLINED DIGIT ZERO, is new in 16.0.0 and Nd; U+0378 is unassigned), negations included;
// properties that are not spelled out are refused by name.
func TestSpellUnicodeClasses(t *testing.T) {
	for _, c := range []struct {
		pat, in string
		want    bool
	}{
		{`^\p{N}$`, "\U0001CCF0", true},
		{`^\d$`, "\U0001CCF0", true},
		{`^\pN$`, "\U0001CCF0", true},
		{`^\P{N}$`, "\U0001CCF0", false},
		{`^\D$`, "\U0001CCF0", false},
		{`^[^\p{L}\p{N}]$`, "\U0001CCF0", false},
		{`^\p{^N}$`, "a", true},
		{`^\p{L}$`, "\u0378", false},
		{`^\P{L}$`, "\u0378", true},
		{`^[\P{L}]$`, "a", false},
		{`^\p{Lu}$`, "A", true},
		{`^\p{Lu}$`, "a", false},
		{`^[]a]+$`, "]a", true},
	} {
		re, err := compileHFRegex(c.pat)
		if err != nil {
			t.Fatalf("%s: %v", c.pat, err)
		}
		got, err := re.MatchString(c.in)
		if err != nil || got != c.want {
			t.Errorf("%s on %+q: %v (%v), want %v", c.pat, c.in, got, err, c.want)
		}
	}
	for _, pat := range []string{`\p{Han}`, `\w+`, `\bx`, `\p{L`, `[[:alpha:]]`} {
		_, err := compileHFRegex(pat)
		if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "regex") {
			t.Errorf("%s: %v, want ErrUnsupported naming the regex", pat, err)
		}
	}
}
