package drills

import (
	"slices"
	"strconv"
	"strings"
	"testing"
)

// signals are the queries whose data an alert expression compares: the expression split at its
// top-level set operators (and, or, unless, with their on/ignoring modifiers), each part
// without a comparison against a number ("rate(x[5m]) > 0" is rate(x[5m])) and absent(x) as x.
// An alert whose signals return data is evaluated on live series, not on a name that no longer
// exists, which a threshold alert cannot tell apart from "all is well".
func signals(expr string) []string {
	expr = strings.TrimSpace(expr)
	if inner, ok := unwrap(expr); ok {
		return signals(inner)
	}
	if parts := splitTop(expr, []string{"and", "or", "unless"}); len(parts) > 1 {
		var out []string
		for _, p := range parts {
			out = append(out, signals(p)...)
		}
		return out
	}
	for _, f := range []string{"absent", "absent_over_time"} {
		if rest, ok := strings.CutPrefix(expr, f); ok {
			if inner, ok := unwrap(strings.TrimSpace(rest)); ok {
				return signals(inner)
			}
		}
	}
	if l, r, ok := cutComparison(expr); ok {
		switch {
		case isNumber(r):
			return signals(l)
		case isNumber(l):
			return signals(r)
		}
	}
	return []string{expr}
}

// unwrap returns s without the parentheses that enclose all of it.
func unwrap(s string) (string, bool) {
	if !strings.HasPrefix(s, "(") || !strings.HasSuffix(s, ")") {
		return s, false
	}
	depth := 0
	for i, r := range topLevel(s) {
		switch r {
		case '(':
			depth++
		case ')':
			depth--
			if depth == 0 && i != len(s)-1 {
				return s, false // "(a) > (b)"
			}
		}
	}
	return strings.TrimSpace(s[1 : len(s)-1]), true
}

// topLevel returns s with every character inside a string literal replaced by a space, so that
// scanning for brackets and operators never looks inside quotes.
func topLevel(s string) string {
	b := []byte(s)
	var quote byte
	for i := 0; i < len(b); i++ {
		switch {
		case quote != 0 && b[i] == '\\':
			b[i] = ' '
			if i+1 < len(b) {
				i++
				b[i] = ' '
			}
		case quote != 0 && b[i] == quote:
			quote = 0
		case quote != 0:
			b[i] = ' '
		case b[i] == '"' || b[i] == '\'' || b[i] == '`':
			quote = b[i]
		}
	}
	return string(b)
}

// depths returns, for each byte of s, its bracket depth ((), [], {}).
func depths(s string) []int {
	d := make([]int, len(s))
	depth := 0
	for i := 0; i < len(s); i++ {
		if s[i] == ')' || s[i] == ']' || s[i] == '}' {
			depth--
		}
		d[i] = depth
		if s[i] == '(' || s[i] == '[' || s[i] == '{' {
			depth++
		}
	}
	return d
}

// splitTop splits s at the top-level keywords ops, dropping a vector-matching modifier
// (on(...), ignoring(...)) that follows one.
func splitTop(s string, ops []string) []string {
	t := topLevel(s)
	d := depths(t)
	var parts []string
	start := 0
	for i := 0; i < len(t); i++ {
		if d[i] != 0 || (i > 0 && isWordByte(t[i-1])) {
			continue
		}
		for _, op := range ops {
			end := i + len(op)
			if !strings.HasPrefix(t[i:], op) || end >= len(t) || isWordByte(t[end]) {
				continue
			}
			parts = append(parts, strings.TrimSpace(s[start:i]))
			rest := strings.TrimLeft(t[end:], " \t\n")
			skip := len(t[end:]) - len(rest)
			for _, mod := range []string{"on", "ignoring"} {
				if m, ok := strings.CutPrefix(rest, mod); ok && strings.HasPrefix(strings.TrimLeft(m, " "), "(") {
					close := strings.IndexByte(rest, ')')
					skip += close + 1
				}
			}
			start = end + skip
			i = start - 1
			break
		}
	}
	return append(parts, strings.TrimSpace(s[start:]))
}

// cutComparison splits s at its last top-level comparison operator (and a bool modifier).
func cutComparison(s string) (left, right string, ok bool) {
	t := topLevel(s)
	d := depths(t)
	for i := len(t) - 1; i >= 0; i-- {
		if d[i] != 0 {
			continue
		}
		for _, op := range []string{"==", "!=", ">=", "<=", ">", "<"} {
			if !strings.HasPrefix(t[i:], op) {
				continue
			}
			if len(op) == 1 && i > 0 && strings.ContainsRune("=!<>", rune(t[i-1])) {
				continue // the second byte of a two-byte operator
			}
			right = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(s[i+len(op):]), "bool"))
			return strings.TrimSpace(s[:i]), right, true
		}
	}
	return "", "", false
}

func isWordByte(b byte) bool {
	return b == '_' || b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9'
}

func isNumber(s string) bool {
	_, err := strconv.ParseFloat(s, 64)
	return err == nil
}

// The signals of the shapes alert expressions take, worked out by hand.
func TestSignals(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`up{job=~".*prefixmesh.*"} == 0`, []string{`up{job=~".*prefixmesh.*"}`}},
		{`rate(prefixmesh_gossip_repairs_total{reason=~"gap|behind"}[5m]) > 0.1`, []string{`rate(prefixmesh_gossip_repairs_total{reason=~"gap|behind"}[5m])`}},
		{`sum(rate(a[15m])) / sum(rate(b[15m])) < 0.9 and sum(rate(b[15m])) > 0`, []string{`sum(rate(a[15m])) / sum(rate(b[15m]))`, `sum(rate(b[15m]))`}},
		{`(max(x) < bool 1) unless on(job) y == 1`, []string{`max(x)`, `y`}},
		{`absent(prefixmesh_pins_is_leader == 1)`, []string{`prefixmesh_pins_is_leader`}},
		{`count(x == 1) == 0`, []string{`count(x == 1)`}},
		{`histogram_quantile(0.99, sum by (le) (rate(h_bucket[5m]))) > 1`, []string{`histogram_quantile(0.99, sum by (le) (rate(h_bucket[5m])))`}},
		{`x{reason="a > b and c"} > 2`, []string{`x{reason="a > b and c"}`}},
		{`0 < x`, []string{`x`}},
		{`a > b`, []string{`a > b`}},
		{`landor_total > 1`, []string{`landor_total`}},
	} {
		if got := signals(tc.expr); !slices.Equal(got, tc.want) {
			t.Errorf("signals(%q) = %q, want %q", tc.expr, got, tc.want)
		}
	}
}
