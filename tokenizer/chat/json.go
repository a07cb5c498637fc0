package chat

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/ardanlabs/jinja"

	"github.com/prefixmesh/prefixmesh/tokenizer"
)

// ErrIntegralFloat: a JSON number such as 1.0 or 2e3 renders as "1.0" / "2000.0" in Python's
// tojson but as "1" / "2000" in the Go engine, so a request that carries one is refused rather
// than rendered differently.
var ErrIntegralFloat = fmt.Errorf("%w: a JSON float with an integral value (such as 1.0), which Python's tojson prints differently", tokenizer.ErrUnsupported)

// maxJSONDepth bounds nesting so hostile input cannot recurse without end.
const maxJSONDepth = 64

// numberValue is Python's json.loads on a number: an int unless it has a fraction or exponent.
func numberValue(s string) (jinja.Value, error) {
	if !strings.ContainsAny(s, ".eE") {
		if n, err := strconv.ParseInt(s, 10, 64); err == nil {
			return jinja.NewInt(n), nil
		}
		return jinja.None(), fmt.Errorf("integer %s does not fit in 64 bits", s)
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return jinja.None(), fmt.Errorf("number %s: %w", s, err)
	}
	if f == math.Trunc(f) {
		return jinja.None(), fmt.Errorf("%w: %s", ErrIntegralFloat, s)
	}
	return jinja.NewFloat(f), nil
}

// parseOrdered decodes a whole JSON document into template values, keeping object key order
// (Python's json.loads does, and tojson prints keys in that order). It accepts exactly what
// encoding/json accepts, with the same repairs: invalid UTF-8 and lone surrogates become U+FFFD.
func parseOrdered(b []byte) (jinja.Value, error) {
	p := &jsonParser{b: b}
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
