package chat

import (
	"errors"
	"math"
	"strconv"
	"strings"

	"github.com/ardanlabs/jinja"
)

// maxJSONDepth bounds nesting so hostile input cannot recurse without end.
const maxJSONDepth = 64

// maxIntDigits is CPython's int_max_str_digits default (4300): json.loads raises ValueError on
// a longer integer, so vLLM refuses such a body and turns such tool-call arguments into {}.
const maxIntDigits = 4300

// parseInfo is what parsing a request learned that rendering needs to stay exact.
type parseInfo struct {
	nums *numberTable // the request's floats and integers beyond int64 (nil if none)
	// goPrints: a number the Go engine prints differently from Python outside tojson and
	// {{ … }} (through ~, join, format …): 1.0, 1234567.5, an integer beyond int64.
	goPrints bool
	// pySpace: a string holds U+001C–U+001F, which Python's str.strip()/split() treat as
	// whitespace and Go's do not.
	pySpace bool
}

// numberTable keeps integers too big for int64 (Python ints have no bound): in the template
// they are floats (so comparisons and tests on numbers behave), printed from their digits.
type numberTable struct {
	big    map[uint64]string // float64 bits → the integer's digits
	floats map[uint64]bool   // bits of the request's real floats
	// ambiguous: two different numbers share a float64 (two big integers, or a big integer
	// and a float): the digits to print cannot be told apart.
	ambiguous bool
}

func (t *numberTable) addBig(f float64, digits string) {
	k := math.Float64bits(f)
	if d, ok := t.big[k]; ok && d != digits || t.floats[k] {
		t.ambiguous = true
	}
	t.big[k] = digits
}

func (t *numberTable) addFloat(f float64) {
	k := math.Float64bits(f)
	if _, ok := t.big[k]; ok {
		t.ambiguous = true
	}
	t.floats[k] = true
}

// digits returns the digits of a big integer's float stand-in.
func (t *numberTable) digits(f float64) (string, bool) {
	if t == nil || len(t.big) == 0 {
		return "", false
	}
	d, ok := t.big[math.Float64bits(f)]
	return d, ok
}

// numberValue is Python's json.loads on a number: an int unless it has a fraction or exponent
// (any size), else a float (±inf past the float range, as float() gives).
func (p *jsonParser) numberValue(s string) (jinja.Value, error) {
	if !strings.ContainsAny(s, ".eE") {
		if n, err := strconv.ParseInt(s, 10, 64); err == nil {
			return jinja.NewInt(n), nil
		}
		if len(strings.TrimPrefix(s, "-")) > maxIntDigits {
			return jinja.None(), p.errorf("integer of more than %d digits (Python refuses it)", maxIntDigits)
		}
		f, _ := strconv.ParseFloat(s, 64) // ±Inf past the range: still a distinct key per sign
		digits := strings.TrimLeft(strings.TrimPrefix(s, "-"), "0")
		if strings.HasPrefix(s, "-") {
			digits = "-" + digits
		}
		p.numbers().addBig(f, digits)
		p.info.goPrints = true
		return jinja.NewFloat(f), nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return jinja.None(), p.errorf("number %s: %v", s, err)
	}
	return p.float(f), nil
}

// float records a float of the request.
func (p *jsonParser) float(f float64) jinja.Value {
	p.numbers().addFloat(f)
	if goPrintsFloat(f) != pyFloatRepr(f) {
		p.info.goPrints = true
	}
	return jinja.NewFloat(f)
}

func (p *jsonParser) numbers() *numberTable {
	if p.info.nums == nil {
		p.info.nums = &numberTable{big: map[uint64]string{}, floats: map[uint64]bool{}}
	}
	return p.info.nums
}

// parseOrdered decodes a whole JSON document into template values as Python's json.loads does:
// object key order kept (tojson prints keys in that order), integers of any size, NaN,
// Infinity and -Infinity accepted. Invalid UTF-8 and lone surrogates become U+FFFD. info
// collects what rendering needs to know (it may be shared by the documents of one request).
func parseOrdered(b []byte, info *parseInfo) (jinja.Value, error) {
	p := &jsonParser{b: b, info: info}
	p.space()
	v, err := p.value(0)
	if err != nil {
		return jinja.None(), err
	}
	p.space()
	if p.i != len(p.b) {
		return jinja.None(), p.errorf("trailing data after the JSON value")
	}
	return v, nil
}

// get returns d[key] or Undefined.
func get(d *jinja.Dict, key string) jinja.Value {
	if v, ok := d.Get(key); ok {
		return v
	}
	return jinja.Undefined()
}

// present reports whether v is set (not undefined, not null).
func present(v jinja.Value) bool { return !v.IsUndefined() && !v.IsNone() }
