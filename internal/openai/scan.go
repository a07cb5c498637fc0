package openai

import (
	"bytes"
	"encoding/json"
	"strconv"
	"unicode/utf8"
)

// maxNesting is the deepest JSON nesting a body may have: encoding/json's own limit (10,000), so
// the scanner accepts exactly what encoding/json accepts. The scanner's work does not depend on
// it (one pass whatever the depth); it bounds the container stack's memory.
const maxNesting = 10000

// scanner validates JSON and finds the spans of an object's members in one forward pass, without
// decoding the values it skips (encoding/json's Decoder copies the body and builds every value;
// for an 8k-token prompt that was most of the front door's CPU). steps counts loop iterations for
// the linearity fuzz test.
type scanner struct {
	b     []byte
	steps int
	stack []byte // open containers, '{' or '['
	// prompt, when set, parses the "prompt" member in place of the generic skipper (one pass
	// over the largest field instead of two); its result is kept in parsed.
	prompt *promptParser
	parsed Prompt
}

// syntaxError is a body that is not JSON.
func (s *scanner) syntaxError(i int, what string) error {
	if i >= len(s.b) {
		return Invalid("", "invalid JSON: unexpected end of the body")
	}
	return Invalid("", "invalid JSON at byte %d: %s %s", i, what, strconv.QuoteRune(rune(s.b[i])))
}

func (s *scanner) ws(i int) int {
	for i < len(s.b) {
		switch s.b[i] {
		case ' ', '\t', '\n', '\r':
			s.steps++
			i++
		default:
			return i
		}
	}
	return i
}

// str skips the string starting at b[i] == '"' and returns the index after its closing quote and
// whether it holds escapes.
func (s *scanner) str(i int) (int, bool, error) {
	b := s.b
	esc := false
	i++
	for {
		s.steps++
		if i >= len(b) {
			return i, esc, s.syntaxError(i, "")
		}
		switch c := b[i]; {
		case c == '"':
			return i + 1, esc, nil
		case c == '\\':
			esc = true
			if i+1 >= len(b) {
				return i + 1, esc, s.syntaxError(i+1, "")
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(b) {
					return len(b), esc, s.syntaxError(len(b), "")
				}
				for k := i + 2; k < i+6; k++ {
					if !isHex(b[k]) {
						return k, esc, s.syntaxError(k, "invalid character in \\u escape:")
					}
				}
				i += 6
			default:
				return i + 1, esc, s.syntaxError(i+1, "invalid escape")
			}
		case c < 0x20:
			return i, esc, s.syntaxError(i, "control character in string:")
		default:
			i++
		}
	}
}

func isHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }

func (s *scanner) digits(i int) int {
	for i < len(s.b) && s.b[i] >= '0' && s.b[i] <= '9' {
		s.steps++
		i++
	}
	return i
}

// num skips the number starting at b[i].
func (s *scanner) num(i int) (int, error) {
	b := s.b
	if b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		i = s.digits(i)
	default:
		return i, s.syntaxError(i, "invalid character in number:")
	}
	if i < len(b) && b[i] == '.' {
		j := s.digits(i + 1)
		if j == i+1 {
			return j, s.syntaxError(j, "invalid character after decimal point:")
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := s.digits(i)
		if j == i {
			return j, s.syntaxError(j, "invalid character in exponent:")
		}
		i = j
	}
	return i, nil
}

// value skips the JSON value starting at b[i] (whitespace already skipped), validating it, and
// returns the index after it. Nesting is tracked on an explicit stack: no recursion.
func (s *scanner) value(i int) (int, error) {
	b := s.b
	base := len(s.stack)
	for {
		s.steps++
		// A value starts at i.
		i = s.ws(i)
		if i >= len(b) {
			return i, s.syntaxError(i, "")
		}
		var err error
		closed := true
		switch c := b[i]; {
		case c == '{' || c == '[':
			if len(s.stack) >= maxNesting {
				return i, Invalid("", "invalid JSON: nested deeper than %d levels", maxNesting)
			}
			j := s.ws(i + 1)
			if j < len(b) && (c == '{' && b[j] == '}' || c == '[' && b[j] == ']') {
				i = j + 1
				break
			}
			s.stack = append(s.stack, c)
			closed = false
			i = j
			if c == '{' {
				if i, err = s.key(i); err != nil {
					return i, err
				}
			}
		case c == '"':
			i, _, err = s.str(i)
		case c == 't':
			i, err = s.lit(i, "true")
		case c == 'f':
			i, err = s.lit(i, "false")
		case c == 'n':
			i, err = s.lit(i, "null")
		case c == '-' || c >= '0' && c <= '9':
			i, err = s.num(i)
		default:
			return i, s.syntaxError(i, "invalid character")
		}
		if err != nil {
			return i, err
		}
		if !closed {
			continue // the container's first value follows
		}
		// After a value: close containers or move to the next element.
		for {
			s.steps++
			if len(s.stack) == base {
				return i, nil
			}
			i = s.ws(i)
			if i >= len(b) {
				return i, s.syntaxError(i, "")
			}
			top := s.stack[len(s.stack)-1]
			if b[i] == ',' {
				i++
				if top == '{' {
					if i, err = s.key(s.ws(i)); err != nil {
						return i, err
					}
				}
				break
			}
			if top == '{' && b[i] == '}' || top == '[' && b[i] == ']' {
				s.stack = s.stack[:len(s.stack)-1]
				i++
				continue
			}
			return i, s.syntaxError(i, "invalid character after a value:")
		}
	}
}

// key skips an object key and its colon, starting at b[i].
func (s *scanner) key(i int) (int, error) {
	if i >= len(s.b) || s.b[i] != '"' {
		return i, s.syntaxError(i, "expected a string key, got")
	}
	i, _, err := s.str(i)
	if err != nil {
		return i, err
	}
	i = s.ws(i)
	if i >= len(s.b) || s.b[i] != ':' {
		return i, s.syntaxError(i, "expected ':' after an object key, got")
	}
	return i + 1, nil
}

func (s *scanner) lit(i int, word string) (int, error) {
	if !bytes.HasPrefix(s.b[i:], []byte(word)) {
		return i, s.syntaxError(i, "invalid literal starting with")
	}
	return i + len(word), nil
}

// members validates body as one JSON object and calls f with each member's key (decoded) and
// value (its raw bytes, a sub-slice of body), in order. Keys match exactly, as in vLLM (pydantic),
// not case-insensitively as in encoding/json.
func (s *scanner) members(body []byte, f func(key string, val []byte) error) error {
	s.b = body
	i := s.ws(0)
	if i >= len(body) {
		return Invalid("", "the request body is empty; send a JSON object")
	}
	if body[i] != '{' {
		end, err := s.value(i)
		if err != nil {
			return err
		}
		if s.ws(end) != len(body) {
			return Invalid("", "invalid JSON: trailing data after the request")
		}
		return Invalid("", "the request body must be a JSON object, got %s", kindOf(body[i]))
	}
	i = s.ws(i + 1)
	if i < len(body) && body[i] == '}' {
		i++
	} else {
		for {
			s.steps++
			if i >= len(body) || body[i] != '"' {
				return s.syntaxError(i, "expected a string key, got")
			}
			kend, esc, err := s.str(i)
			if err != nil {
				return err
			}
			key := memberKey(body[i+1 : kend-1])
			if esc || !utf8.ValidString(key) { // decoded as encoding/json decodes it
				if err := json.Unmarshal(body[i:kend], &key); err != nil {
					return Invalid("", "invalid JSON key at byte %d: %v", i, err)
				}
			}
			i = s.ws(kend)
			if i >= len(body) || body[i] != ':' {
				return s.syntaxError(i, "expected ':' after an object key, got")
			}
			vstart := s.ws(i + 1)
			var vend int
			if key == "prompt" && s.prompt != nil && vstart < len(body) {
				s.parsed, vend, err = s.prompt.parseAt(body, vstart)
				s.parsed.Start, s.parsed.End = vstart, vend
				s.steps += s.prompt.steps
				s.prompt.steps = 0
			} else {
				vend, err = s.value(vstart)
			}
			if err != nil {
				return err
			}
			if err := f(key, body[vstart:vend]); err != nil {
				return err
			}
			i = s.ws(vend)
			if i < len(body) && body[i] == ',' {
				i = s.ws(i + 1)
				continue
			}
			if i < len(body) && body[i] == '}' {
				i++
				break
			}
			return s.syntaxError(i, "expected ',' or '}' after an object member, got")
		}
	}
	if s.ws(i) != len(body) {
		return Invalid("", "invalid JSON: trailing data after the request object")
	}
	return nil
}

// memberKey is a key's string, without allocating for the keys the parsers look for.
func memberKey(b []byte) string {
	switch string(b) { // a switch on a conversion does not allocate
	case "model":
		return "model"
	case "prompt":
		return "prompt"
	case "messages":
		return "messages"
	case "max_tokens":
		return "max_tokens"
	case "max_completion_tokens":
		return "max_completion_tokens"
	case "stream":
		return "stream"
	case "stream_options":
		return "stream_options"
	case "n":
		return "n"
	case "adapter_id":
		return "adapter_id"
	case "user":
		return "user"
	case "session_id":
		return "session_id"
	}
	return string(b)
}

func kindOf(c byte) string {
	switch {
	case c == '"':
		return "a string"
	case c == '[':
		return "an array"
	case c == 't' || c == 'f':
		return "a boolean"
	case c == 'n':
		return "null"
	}
	return "a number"
}

// field decodes one member's value into v with encoding/json (the values decoded this way are
// small: names, numbers, flags), naming the field in JSON's terms on a type error.
func field(name string, val []byte, v any) error {
	err := json.Unmarshal(val, v)
	if err == nil {
		return nil
	}
	if te, ok := err.(*json.UnmarshalTypeError); ok {
		param := name
		if f := jsonField(te.Field); f != "" {
			param = name + "." + f
		}
		return Invalid(param, "%s: expected %s, got %s", param, jsonType(te.Type), te.Value)
	}
	return Invalid(name, "%s: %v", name, err)
}

// genField decodes a GenParams member; it reports whether key is one.
func (g *GenParams) genField(key string, val []byte) (bool, error) {
	var v any
	switch key {
	case "model":
		v = &g.Model
	case "max_tokens":
		v = &g.MaxTokens
	case "max_completion_tokens":
		v = &g.MaxCompletionTokens
	case "stream":
		v = &g.Stream
	case "stream_options":
		v = &g.StreamOptions
	case "n":
		v = &g.N
	case "adapter_id":
		v = &g.AdapterID
	case "user":
		v = &g.User
	case "session_id":
		v = &g.SessionID
	default:
		return false, nil
	}
	return true, field(key, val, v)
}
