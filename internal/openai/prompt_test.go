package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestParsePromptShapes(t *testing.T) {
	for _, tc := range []struct {
		raw   string
		batch bool
		want  []any // string or []uint32 per item
	}{
		{`"hello"`, false, []any{"hello"}},
		{` "h\u00e9\n" `, false, []any{"hé\n"}},
		{`[1,2, 3]`, false, []any{[]uint32{1, 2, 3}}},
		{`[4294967295, 0]`, false, []any{[]uint32{4294967295, 0}}},
		{`[1.0, 1e3, 2E+1]`, false, []any{[]uint32{1, 1000, 20}}},
		{`["a","b"]`, true, []any{"a", "b"}},
		{`["a"]`, true, []any{"a"}},
		{`[[1],[2,3]]`, true, []any{[]uint32{1}, []uint32{2, 3}}},
	} {
		p, err := ParsePrompt([]byte(tc.raw))
		if err != nil {
			t.Errorf("%s: %v", tc.raw, err)
			continue
		}
		if p.Batch != tc.batch || len(p.Items) != len(tc.want) {
			t.Errorf("%s: batch %v items %d, want %v %d", tc.raw, p.Batch, len(p.Items), tc.batch, len(tc.want))
			continue
		}
		for i, w := range tc.want {
			it := p.Items[i]
			switch w := w.(type) {
			case string:
				if !it.IsText() || it.Text != w {
					t.Errorf("%s item %d: %+v, want %q", tc.raw, i, it, w)
				}
			case []uint32:
				if it.IsText() || !slices.Equal(it.IDs, w) {
					t.Errorf("%s item %d: %+v, want %v", tc.raw, i, it, w)
				}
			}
			// The span is the item's own JSON.
			var v any
			if err := json.Unmarshal([]byte(tc.raw)[it.Start:it.End], &v); err != nil {
				t.Errorf("%s item %d: span %q is not JSON: %v", tc.raw, i, tc.raw[it.Start:it.End], err)
			}
		}
	}
}

func TestParsePromptRefuses(t *testing.T) {
	for _, tc := range []struct{ raw, param, msg string }{
		{``, "prompt", "required"},
		{`null`, "prompt", "required"},
		{`""`, "prompt", "empty"},
		{`[]`, "prompt", "empty"},
		{`[[]]`, "prompt[0]", "empty"},
		{`[""]`, "prompt[0]", "empty"},
		{`[1,null]`, "prompt", "prompt[1]: expected a token id"},
		{`[[1,null]]`, "prompt[0]", "got null"},
		{`[-1]`, "prompt", "-1 is not a token id"},
		{`[4294967296]`, "prompt", "4294967296 is not a token id"},
		{`[1.5]`, "prompt", "1.5 is not a token id"},
		{`[01]`, "prompt", "not a token id"},
		{`[[[1]]]`, "prompt[0]", "nest at most two levels"},
		{`["a",[1]]`, "prompt[1]", "only strings"},
		{`[[1],"a"]`, "prompt[1]", "only arrays of token ids"},
		{`[1,"a"]`, "prompt", "got a string"},
		{`{"a":1}`, "prompt", "got an object"},
		{`12`, "prompt", "got a number"},
		{`"a" "b"`, "prompt", "after the value"},
		{`[1,2`, "prompt", "the end of the JSON"},
		{`"abc`, "prompt", "unterminated"},
		{"\"a\x01\"", "prompt", "control character"},
		{`"\x"`, "prompt", "invalid string"},
		{`["a"`, "prompt", "the end of the JSON"},
	} {
		_, err := ParsePrompt([]byte(tc.raw))
		var e *Error
		if !errors.As(err, &e) {
			t.Errorf("%q: accepted (err %v)", tc.raw, err)
			continue
		}
		if e.Status != 400 || e.Param != tc.param || !strings.Contains(e.Message, tc.msg) {
			t.Errorf("%q: %d %q %q, want param %q and %q", tc.raw, e.Status, e.Param, e.Message, tc.param, tc.msg)
		}
	}
	big := "[" + strings.Repeat(`"a",`, MaxBatchPrompts) + `"a"]`
	if _, err := ParsePrompt([]byte(big)); err == nil || !strings.Contains(err.Error(), "at most") {
		t.Errorf("a batch over MaxBatchPrompts: %v", err)
	}
}

// nested is n one-element arrays around a token id: the input that cost seconds of CPU when the
// parser tried each shape and recursed.
func nested(n int) []byte {
	return []byte(strings.Repeat("[", n) + "1" + strings.Repeat("]", n))
}

// stepBound is the parser's work limit for an input of n bytes: each byte is looked at by a
// constant number of loop steps, whatever the nesting.
func stepBound(n int) int { return 3*n + 16 }

func TestNestedPromptIsLinear(t *testing.T) {
	for _, n := range []int{3, 100, 9999, 1 << 20} {
		raw := nested(n)
		_, err, steps := parseSteps(raw)
		if err == nil {
			t.Fatalf("depth %d accepted", n)
		}
		if steps > stepBound(len(raw)) {
			t.Fatalf("depth %d: %d steps for %d bytes", n, steps, len(raw))
		}
	}
}

// The whole request path (the scanner over the body, the prompt parsed in place) stays linear on
// a hostile body of nested one-element arrays: doubling the nesting at most doubles the time, with a generous
// factor of 6 for a loaded machine (quadratic work would take 4× per doubling, and the old parser
// took 8 s at depth 9,999). Minimum of several runs, so one descheduling does not fail it.
func TestNestedRequestTimeLinear(t *testing.T) {
	for _, shape := range []struct {
		name   string
		body   func(n int) []byte
		accept bool
	}{
		{"nested prompt", func(n int) []byte { return []byte(`{"model":"m","prompt":` + string(nested(n)) + `}`) }, false},
		// Nesting in a field the router does not read is valid JSON, validated and forwarded.
		{"nested extra field", func(n int) []byte {
			return []byte(`{"model":"m","prompt":"x","extra":` + string(nested(n)) + `}`)
		}, true},
	} {
		best := func(b []byte) time.Duration {
			d := time.Duration(1 << 62)
			for range 7 {
				start := time.Now()
				for range 20 {
					if _, err := ParseCompletion(b); (err == nil) != shape.accept {
						t.Fatalf("%s: %v", shape.name, err)
					}
				}
				d = min(d, time.Since(start))
			}
			return d
		}
		n := 4999 // JSON nesting is capped at 10,000 (maxNesting), so 2n stays below it
		t1, t2 := best(shape.body(n)), best(shape.body(2*n))
		if t2 > 6*t1+time.Millisecond {
			t.Fatalf("%s: depth %d took %v, depth %d took %v: super-linear", shape.name, n, t1, 2*n, t2)
		}
	}
}

// Whatever the input: the parser's steps are linear in its length (fails on super-linear work),
// it refuses anything that is not JSON, and what it accepts is what encoding/json reads from the
// same bytes in OpenAI's shape.
func FuzzParsePrompt(f *testing.F) {
	for _, s := range []string{`"x"`, `[1,2,3]`, `[[1],[2]]`, `["a","b"]`, `[[[1]]]`, `[1,null]`, `[1.0,2e2]`,
		`[-0]`, `"\ud83d\ude00"`, `[ 1 , 2 ]`, `[[1] , [2]]`, string(nested(50)), `["a",[1]]`, `[4294967296]`} {
		f.Add([]byte(s))
	}
	// Long arrays as Go's and Python's encoders write them: the word-at-a-time path.
	var compact, spaced []string
	for i := range 120 {
		compact, spaced = append(compact, strconv.Itoa(i*7919%100003)), append(spaced, strconv.Itoa(i*104729%1000))
	}
	f.Add([]byte("[" + strings.Join(compact, ",") + "]"))
	f.Add([]byte("[" + strings.Join(spaced, ", ") + "]"))
	f.Add([]byte("[[" + strings.Join(compact, ",") + "],[" + strings.Join(spaced, ", ") + "]]"))
	f.Fuzz(func(t *testing.T, raw []byte) {
		p, err, steps := parseSteps(raw)
		if steps > stepBound(len(raw)) {
			t.Fatalf("%d steps for %d bytes: super-linear", steps, len(raw))
		}
		// Doubling the nesting around the input doubles the bound, never more.
		wrapped := append(append([]byte("[["), raw...), "]]"...)
		if _, _, s2 := parseSteps(wrapped); s2 > stepBound(len(wrapped)) {
			t.Fatalf("%d steps for %d bytes (wrapped): super-linear", s2, len(wrapped))
		}
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.Status != 400 || e.Param == "" {
				t.Fatalf("%q: error without a status and param: %v", raw, err)
			}
			return
		}
		if !json.Valid(raw) {
			t.Fatalf("accepted invalid JSON %q", raw)
		}
		if len(p.Items) == 0 {
			t.Fatalf("%q: accepted with no prompt", raw)
		}
		check := func(it PromptItem, v any) {
			switch v := v.(type) {
			case string:
				if !it.IsText() || it.Text != v || v == "" {
					t.Fatalf("%q: item %+v, encoding/json reads %q", raw, it, v)
				}
			case []any:
				if it.IsText() || len(it.IDs) != len(v) || len(v) == 0 {
					t.Fatalf("%q: item %+v, encoding/json reads %v", raw, it, v)
				}
				for i, x := range v {
					f, ok := x.(float64)
					if !ok || f != float64(it.IDs[i]) {
						t.Fatalf("%q: id %d = %d, encoding/json reads %v", raw, i, it.IDs[i], x)
					}
				}
			default:
				t.Fatalf("%q: accepted, encoding/json reads %T", raw, v)
			}
		}
		var v any
		if err := json.Unmarshal(raw, &v); err != nil {
			t.Fatal(err)
		}
		if !p.Batch {
			check(p.Items[0], v)
			return
		}
		arr, ok := v.([]any)
		if !ok || len(arr) != len(p.Items) {
			t.Fatalf("%q: batch of %d, encoding/json reads %v", raw, len(p.Items), v)
		}
		for i := range arr {
			check(p.Items[i], arr[i])
			if !bytes.Equal(bytes.TrimSpace(raw[p.Items[i].Start:p.Items[i].End]), raw[p.Items[i].Start:p.Items[i].End]) {
				t.Fatalf("%q: span of item %d has surrounding space", raw, i)
			}
		}
	})
}

func TestParseIDs(t *testing.T) {
	if ids, err := ParseIDs([]byte(` [1, 2] `), "tokens"); err != nil || !slices.Equal(ids, []uint32{1, 2}) {
		t.Fatalf("%v %v", ids, err)
	}
	for _, raw := range []string{``, `null`, `[]`, `"a"`, `[1,null]`, `[[1]]`, `[1] 2`, `[-1]`} {
		var e *Error
		if _, err := ParseIDs([]byte(raw), "tokens"); !errors.As(err, &e) || e.Param != "tokens" {
			t.Errorf("%q: %v", raw, err)
		}
	}
}
