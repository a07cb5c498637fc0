package chat

import (
	"bytes"
	"encoding/json"
	"errors"
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

// decodeOrdered decodes one JSON value into a template value, keeping object key order (Python's
// json.loads does, and tojson prints keys in that order).
func decodeOrdered(dec *json.Decoder, depth int) (jinja.Value, error) {
	if depth > maxJSONDepth {
		return jinja.None(), fmt.Errorf("JSON nested deeper than %d", maxJSONDepth)
	}
	tok, err := dec.Token()
	if err != nil {
		return jinja.None(), err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			d := jinja.NewDict()
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return jinja.None(), err
				}
				v, err := decodeOrdered(dec, depth+1)
				if err != nil {
					return jinja.None(), err
				}
				d.AsDict().Set(k.(string), v) // a repeated key keeps its first place and the last value, as in Python
			}
			if _, err := dec.Token(); err != nil {
				return jinja.None(), err
			}
			return d, nil
		case '[':
			var items []jinja.Value
			for dec.More() {
				v, err := decodeOrdered(dec, depth+1)
				if err != nil {
					return jinja.None(), err
				}
				items = append(items, v)
			}
			if _, err := dec.Token(); err != nil {
				return jinja.None(), err
			}
			return jinja.NewList(items), nil
		}
	case string:
		return jinja.NewString(t), nil
	case json.Number:
		return numberValue(string(t))
	case bool:
		return jinja.NewBool(t), nil
	case nil:
		return jinja.None(), nil
	}
	return jinja.None(), fmt.Errorf("unexpected JSON token %v", tok)
}

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

// parseOrdered decodes a whole JSON document.
func parseOrdered(b []byte) (jinja.Value, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	v, err := decodeOrdered(dec, 0)
	if err != nil {
		return v, err
	}
	if _, err := dec.Token(); err == nil {
		return jinja.None(), errors.New("trailing data after the JSON value")
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
