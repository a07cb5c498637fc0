package chat

import (
	"fmt"
	"math"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"
)

// jsonParser is a small recursive-descent JSON parser producing ordered template values: about
// ten times faster than encoding/json's token stream, which matters for long conversations.
type jsonParser struct {
	b    []byte
	i    int
	sb   strings.Builder
	info *parseInfo
}

func (p *jsonParser) errorf(format string, a ...any) error {
	return fmt.Errorf("JSON at byte %d: %s", p.i, fmt.Sprintf(format, a...))
}

func (p *jsonParser) space() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *jsonParser) value(depth int) (jinja.Value, error) {
	if depth > maxJSONDepth {
		return jinja.None(), p.errorf("nested deeper than %d", maxJSONDepth)
	}
	if p.i >= len(p.b) {
		return jinja.None(), p.errorf("unexpected end of input")
	}
	switch c := p.b[p.i]; {
	case c == '{':
		return p.object(depth)
	case c == '[':
		return p.array(depth)
	case c == '"':
		s, err := p.str()
		if err != nil {
			return jinja.None(), err
		}
		return jinja.NewString(s), nil
	case c == 't':
		return jinja.NewBool(true), p.lit("true")
	case c == 'f':
		return jinja.NewBool(false), p.lit("false")
	case c == 'n':
		return jinja.None(), p.lit("null")
	case c == 'N': // Python's json.loads reads NaN, Infinity and -Infinity
		return p.float(math.NaN()), p.lit("NaN")
	case c == 'I':
		return p.float(math.Inf(1)), p.lit("Infinity")
	case c == '-' && p.i+1 < len(p.b) && p.b[p.i+1] == 'I':
		p.i++
		return p.float(math.Inf(-1)), p.lit("Infinity")
	case c == '-' || c >= '0' && c <= '9':
		return p.number()
	}
	return jinja.None(), p.errorf("invalid character %q looking for a value", p.b[p.i])
}

func (p *jsonParser) lit(w string) error {
	if len(p.b)-p.i < len(w) || string(p.b[p.i:p.i+len(w)]) != w {
		return p.errorf("invalid literal (want %s)", w)
	}
	p.i += len(w)
	return nil
}

func (p *jsonParser) object(depth int) (jinja.Value, error) {
	p.i++ // {
	d := jinja.NewDict()
	dd := d.AsDict()
	p.space()
	if p.i < len(p.b) && p.b[p.i] == '}' {
		p.i++
		return d, nil
	}
	for {
		p.space()
		if p.i >= len(p.b) || p.b[p.i] != '"' {
			return jinja.None(), p.errorf("want an object key")
		}
		k, err := p.str()
		if err != nil {
			return jinja.None(), err
		}
		p.space()
		if p.i >= len(p.b) || p.b[p.i] != ':' {
			return jinja.None(), p.errorf("want ':' after an object key")
		}
		p.i++
		p.space()
		v, err := p.value(depth + 1)
		if err != nil {
			return jinja.None(), err
		}
		dd.Set(k, v) // a repeated key keeps its first place and the last value, as in Python
		p.space()
		if p.i >= len(p.b) {
			return jinja.None(), p.errorf("unexpected end of input in an object")
		}
		switch p.b[p.i] {
		case ',':
			p.i++
		case '}':
			p.i++
			return d, nil
		default:
			return jinja.None(), p.errorf("want ',' or '}' in an object")
		}
	}
}

func (p *jsonParser) array(depth int) (jinja.Value, error) {
	p.i++ // [
	var items []jinja.Value
	p.space()
	if p.i < len(p.b) && p.b[p.i] == ']' {
		p.i++
		return jinja.NewList(items), nil
	}
	for {
		p.space()
		v, err := p.value(depth + 1)
		if err != nil {
			return jinja.None(), err
		}
		items = append(items, v)
		p.space()
		if p.i >= len(p.b) {
			return jinja.None(), p.errorf("unexpected end of input in an array")
		}
		switch p.b[p.i] {
		case ',':
			p.i++
		case ']':
			p.i++
			return jinja.NewList(items), nil
		default:
			return jinja.None(), p.errorf("want ',' or ']' in an array")
		}
	}
}

// str reads a string at p.i (at its opening quote).
func (p *jsonParser) str() (string, error) {
	p.i++
	start := p.i
	// Fast path: no escapes, valid UTF-8, no control characters.
	for p.i < len(p.b) {
		c := p.b[p.i]
		if c == '"' {
			s := p.b[start:p.i]
			p.i++
			if utf8.Valid(s) {
				return string(s), nil
			}
			return replaceInvalid(string(s)), nil
		}
		if c == '\\' || c < 0x20 {
			break
		}
		p.i++
	}
	p.sb.Reset()
	p.sb.Write(p.b[start:p.i])
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			p.i++
			s := p.sb.String()
			if !utf8.ValidString(s) {
				s = replaceInvalid(s)
			}
			return s, nil
		case c < 0x20:
			return "", p.errorf("control character in a string")
		case c != '\\':
			p.sb.WriteByte(c)
			p.i++
			continue
		}
		if p.i+1 >= len(p.b) {
			break
		}
		e := p.b[p.i+1]
		p.i += 2
		switch e {
		case '"', '\\', '/':
			p.sb.WriteByte(e)
		case 'b':
			p.sb.WriteByte('\b')
		case 'f':
			p.sb.WriteByte('\f')
		case 'n':
			p.sb.WriteByte('\n')
		case 'r':
			p.sb.WriteByte('\r')
		case 't':
			p.sb.WriteByte('\t')
		case 'u':
			r, ok := p.hex4()
			if !ok {
				return "", p.errorf("invalid \\u escape")
			}
			if r >= 0x1C && r <= 0x1F {
				p.info.pySpace = true
			}
			if utf16.IsSurrogate(r) {
				r2 := rune(-1)
				if p.i+1 < len(p.b) && p.b[p.i] == '\\' && p.b[p.i+1] == 'u' {
					save := p.i
					p.i += 2
					if x, ok := p.hex4(); ok {
						r2 = x
					} else {
						return "", p.errorf("invalid \\u escape")
					}
					if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
						p.sb.WriteRune(dec)
						continue
					}
					p.i = save // not a pair: the second escape is read on its own
				}
				r = utf8.RuneError
			}
			p.sb.WriteRune(r)
		default:
			return "", p.errorf("invalid escape \\%c", e)
		}
	}
	return "", p.errorf("unterminated string")
}

func (p *jsonParser) hex4() (rune, bool) {
	if len(p.b)-p.i < 4 {
		return 0, false
	}
	var r rune
	for _, c := range p.b[p.i : p.i+4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return 0, false
		}
	}
	p.i += 4
	return r, true
}

// number reads a JSON number with RFC 8259's grammar.
func (p *jsonParser) number() (jinja.Value, error) {
	start := p.i
	if p.b[p.i] == '-' {
		p.i++
	}
	digits := func() int {
		n := 0
		for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
			p.i++
			n++
		}
		return n
	}
	if p.i < len(p.b) && p.b[p.i] == '0' {
		p.i++
	} else if digits() == 0 {
		return jinja.None(), p.errorf("invalid number")
	}
	if p.i < len(p.b) && p.b[p.i] == '.' {
		p.i++
		if digits() == 0 {
			return jinja.None(), p.errorf("invalid number")
		}
	}
	if p.i < len(p.b) && (p.b[p.i] == 'e' || p.b[p.i] == 'E') {
		p.i++
		if p.i < len(p.b) && (p.b[p.i] == '+' || p.b[p.i] == '-') {
			p.i++
		}
		if digits() == 0 {
			return jinja.None(), p.errorf("invalid number")
		}
	}
	return p.numberValue(string(p.b[start:p.i]))
}

// replaceInvalid replaces each invalid UTF-8 byte with U+FFFD, as encoding/json does.
func replaceInvalid(s string) string {
	var sb strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		sb.WriteRune(r) // RuneError for an invalid byte (n == 1)
		i += n
	}
	return sb.String()
}
