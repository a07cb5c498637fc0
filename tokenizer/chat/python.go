package chat

import (
	"errors"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"

	"github.com/prefixmesh/prefixmesh/tokenizer"
)

// Python's printing of template values, which the Go engine does differently: json.dumps (the
// tojson filter transformers installs) and str() (what {{ … }}, | string and | trim print).
// Sources: CPython Lib/json/encoder.py (encode_basestring, encode_basestring_ascii,
// _make_iterencode, float.__repr__ with Infinity/NaN), Objects/floatobject.c float_repr with
// Python/pystrtod.c format_float_short (repr mode 'r': exponent notation when the decimal
// point position is <= -4 or > 16, ".0" added to integral values), Objects/unicodeobject.c
// unicode_repr, Objects/unicodectype.c _PyUnicode_IsWhitespace.

// errNotJSON is json.dumps's TypeError on a value JSON cannot hold (an undefined, a callable).
var errNotJSON = errors.New("tojson: object is not JSON serializable")

// pyFloatRepr is Python's repr(float) (which str(float) also is).
func pyFloatRepr(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	case math.IsNaN(f):
		return "nan"
	}
	var buf [32]byte
	e := strconv.AppendFloat(buf[:0], f, 'e', -1, 64) // [-]d[.ddd]e±XX, shortest round trip
	var sb strings.Builder
	if e[0] == '-' {
		sb.WriteByte('-')
		e = e[1:]
	}
	mant, exps, _ := strings.Cut(string(e), "e")
	exp, _ := strconv.Atoi(exps)
	digits := strings.Replace(mant, ".", "", 1)
	decpt := exp + 1 // value = 0.d1d2… × 10^decpt
	switch {
	case decpt <= -4 || decpt > 16:
		sb.WriteByte(digits[0])
		if len(digits) > 1 {
			sb.WriteByte('.')
			sb.WriteString(digits[1:])
		}
		sb.WriteByte('e')
		if exp < 0 {
			sb.WriteByte('-')
			exp = -exp
		} else {
			sb.WriteByte('+')
		}
		if exp < 10 {
			sb.WriteByte('0')
		}
		sb.WriteString(strconv.Itoa(exp))
	case decpt <= 0:
		sb.WriteString("0.")
		sb.WriteString(strings.Repeat("0", -decpt))
		sb.WriteString(digits)
	case decpt >= len(digits):
		sb.WriteString(digits)
		sb.WriteString(strings.Repeat("0", decpt-len(digits)))
		sb.WriteString(".0")
	default:
		sb.WriteString(digits[:decpt])
		sb.WriteByte('.')
		sb.WriteString(digits[decpt:])
	}
	return sb.String()
}

// pyJSONFloat is json.dumps's float: repr, with Infinity, -Infinity and NaN (allow_nan).
func pyJSONFloat(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	case math.IsNaN(f):
		return "NaN"
	}
	return pyFloatRepr(f)
}

// goPrintsFloat is how the Go engine prints a float outside tojson ({{ }} before the rewrite,
// ~, join …): fmt's %g.
func goPrintsFloat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// jsonOpts are json.dumps's arguments that transformers' tojson exposes.
type jsonOpts struct {
	indent      string // "" with hasIndent false: no newlines
	hasIndent   bool
	itemSep     string
	keySep      string
	sortKeys    bool
	ensureASCII bool
}

// encodeJSON writes json.dumps(v) as Python computes it. nums maps the float stand-ins of
// integers too big for int64 to their digits (nil if there are none).
func encodeJSON(sb *strings.Builder, v jinja.Value, o *jsonOpts, nums *numberTable, level int) error {
	if level > maxJSONDepth*2 {
		return errors.New("tojson: nested too deep")
	}
	switch {
	case v.IsUndefined() || v.IsCallable():
		return errNotJSON
	case v.IsNone():
		sb.WriteString("null")
	case v.IsBool():
		if v.AsBool() {
			sb.WriteString("true")
		} else {
			sb.WriteString("false")
		}
	case v.IsInt():
		sb.WriteString(strconv.FormatInt(v.AsInt(), 10))
	case v.IsFloat():
		if d, ok := nums.digits(v.AsFloat()); ok {
			sb.WriteString(d)
		} else {
			sb.WriteString(pyJSONFloat(v.AsFloat()))
		}
	case v.IsString():
		writeJSONString(sb, v.AsString(), o.ensureASCII)
	case v.IsList():
		items := v.AsList().Items
		if len(items) == 0 {
			sb.WriteString("[]")
			return nil
		}
		sb.WriteByte('[')
		for i, it := range items {
			if i > 0 {
				sb.WriteString(o.itemSep)
			}
			o.newline(sb, level+1)
			if err := encodeJSON(sb, it, o, nums, level+1); err != nil {
				return err
			}
		}
		o.newline(sb, level)
		sb.WriteByte(']')
	case v.IsDict():
		d := v.AsDict()
		keys := d.OrderedKeys()
		if len(keys) == 0 {
			sb.WriteString("{}")
			return nil
		}
		if o.sortKeys {
			keys = append([]string(nil), keys...)
			sort.Strings(keys) // UTF-8 byte order is code point order, Python's str order
		}
		sb.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				sb.WriteString(o.itemSep)
			}
			o.newline(sb, level+1)
			writeJSONString(sb, k, o.ensureASCII)
			sb.WriteString(o.keySep)
			val, _ := d.Get(k)
			if err := encodeJSON(sb, val, o, nums, level+1); err != nil {
				return err
			}
		}
		o.newline(sb, level)
		sb.WriteByte('}')
	default:
		return errNotJSON
	}
	return nil
}

func (o *jsonOpts) newline(sb *strings.Builder, level int) {
	if !o.hasIndent {
		return
	}
	sb.WriteByte('\n')
	for i := 0; i < level; i++ {
		sb.WriteString(o.indent)
	}
}

const hexDigits = "0123456789abcdef"

// writeJSONString is json's encode_basestring (ensure_ascii=False: only ", \ and C0 controls
// are escaped; U+2028, U+2029 and DEL are written raw) or encode_basestring_ascii.
func writeJSONString(sb *strings.Builder, s string, ascii bool) {
	sb.WriteByte('"')
	u4 := func(r rune) {
		sb.WriteString(`\u`)
		sb.WriteByte(hexDigits[r>>12&15])
		sb.WriteByte(hexDigits[r>>8&15])
		sb.WriteByte(hexDigits[r>>4&15])
		sb.WriteByte(hexDigits[r&15])
	}
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && (c < 0x7f || !ascii) {
			i++
			continue
		}
		sb.WriteString(s[start:i])
		r, n := rune(c), 1
		if c >= 0x80 {
			r, n = utf8.DecodeRuneInString(s[i:])
		}
		switch r {
		case '"':
			sb.WriteString(`\"`)
		case '\\':
			sb.WriteString(`\\`)
		case '\n':
			sb.WriteString(`\n`)
		case '\r':
			sb.WriteString(`\r`)
		case '\t':
			sb.WriteString(`\t`)
		case '\b':
			sb.WriteString(`\b`)
		case '\f':
			sb.WriteString(`\f`)
		default:
			if r > 0xFFFF {
				r -= 0x10000
				u4(0xD800 + r>>10)
				u4(0xDC00 + r&0x3FF)
			} else {
				u4(r)
			}
		}
		i += n
		start = i
	}
	sb.WriteString(s[start:])
	sb.WriteByte('"')
}

// errNoPythonRepr: a container holds a value whose Python repr the Go side cannot be sure of
// (a character assigned after Unicode 9.0.0, whose printability depends on the Python version).
var errNoPythonRepr = errors.New("no exact Python repr")

// pyStr is str(v) as Jinja prints it: None, True, float repr, a container's repr. ok is false
// when v should be printed by the engine unchanged (a string, an int, an undefined …).
func pyStr(v jinja.Value, nums *numberTable) (string, bool, error) {
	switch {
	case v.IsNone():
		return "None", true, nil
	case v.IsFloat():
		if d, ok := nums.digits(v.AsFloat()); ok {
			return d, true, nil
		}
		return pyFloatRepr(v.AsFloat()), true, nil
	case v.IsList() || v.IsDict():
		var sb strings.Builder
		if err := pyRepr(&sb, v, nums, 0); err != nil {
			return "", false, err
		}
		return sb.String(), true, nil
	}
	return "", false, nil
}

// pyRepr writes repr(v).
func pyRepr(sb *strings.Builder, v jinja.Value, nums *numberTable, level int) error {
	if level > maxJSONDepth*2 {
		return errNoPythonRepr
	}
	switch {
	case v.IsNone():
		sb.WriteString("None")
	case v.IsBool():
		if v.AsBool() {
			sb.WriteString("True")
		} else {
			sb.WriteString("False")
		}
	case v.IsInt():
		sb.WriteString(strconv.FormatInt(v.AsInt(), 10))
	case v.IsFloat():
		s, _, _ := pyStr(v, nums)
		sb.WriteString(s)
	case v.IsString():
		return pyStrRepr(sb, v.AsString())
	case v.IsList():
		sb.WriteByte('[')
		for i, it := range v.AsList().Items {
			if i > 0 {
				sb.WriteString(", ")
			}
			if err := pyRepr(sb, it, nums, level+1); err != nil {
				return err
			}
		}
		sb.WriteByte(']')
	case v.IsDict():
		sb.WriteByte('{')
		d := v.AsDict()
		for i, k := range d.OrderedKeys() {
			if i > 0 {
				sb.WriteString(", ")
			}
			if err := pyStrRepr(sb, k); err != nil {
				return err
			}
			sb.WriteString(": ")
			val, _ := d.Get(k)
			if err := pyRepr(sb, val, nums, level+1); err != nil {
				return err
			}
		}
		sb.WriteByte('}')
	default:
		return errNoPythonRepr
	}
	return nil
}

// pyStrRepr is repr(str): single quotes unless the text has ' and no ", backslash escapes
// for the quote, \ and \t \n \r, \xNN / \uNNNN / \UNNNNNNNN for characters Python does
// not print. Non-ASCII printability follows Unicode's categories (not C*, not Z* but space);
// a character assigned after 9.0.0 is refused, as Python's answer depends on its version.
func pyStrRepr(sb *strings.Builder, s string) error {
	q := byte('\'')
	if strings.IndexByte(s, '\'') >= 0 && strings.IndexByte(s, '"') < 0 {
		q = '"'
	}
	sb.WriteByte(q)
	for _, r := range s {
		switch {
		case r == rune(q) || r == '\\':
			sb.WriteByte('\\')
			sb.WriteRune(r)
		case r == '\t':
			sb.WriteString(`\t`)
		case r == '\n':
			sb.WriteString(`\n`)
		case r == '\r':
			sb.WriteString(`\r`)
		case r < 0x20 || r == 0x7f:
			sb.WriteString(`\x`)
			sb.WriteByte(hexDigits[r>>4])
			sb.WriteByte(hexDigits[r&15])
		case r < 0x7f:
			sb.WriteRune(r)
		case !tokenizer.AssignedInUnicode9(r):
			return errNoPythonRepr
		case unicode.IsPrint(r) && !unicode.Is(unicode.Zs, r):
			sb.WriteRune(r)
		case r < 0x100:
			sb.WriteString(`\x`)
			sb.WriteByte(hexDigits[r>>4])
			sb.WriteByte(hexDigits[r&15])
		case r < 0x10000:
			sb.WriteString(`\u`)
			sb.WriteString(strconv.FormatInt(int64(r)|0x10000, 16)[1:])
		default:
			sb.WriteString(`\U`)
			sb.WriteString(strconv.FormatInt(int64(r)|0x100000000, 16)[1:])
		}
	}
	sb.WriteByte(q)
	return nil
}

// pyIsSpace is Python's str.isspace for one character (str.strip()'s default set): the
// characters of bidirectional class WS, B or S, or of category Zs. Unlike Go's unicode.IsSpace
// it holds U+001C–U+001F; the set has not changed since Unicode 6.3 moved U+180E out of Zs.
func pyIsSpace(r rune) bool {
	switch r {
	case '\t', '\n', '\v', '\f', '\r', 0x1C, 0x1D, 0x1E, 0x1F, ' ', 0x85, 0xA0, 0x1680,
		0x2028, 0x2029, 0x202F, 0x205F, 0x3000:
		return true
	}
	return r >= 0x2000 && r <= 0x200A
}
