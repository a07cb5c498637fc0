package requests

import "strconv"

// The observer reads two things from an engine's JSON (the first chunk with output, the usage's
// cached_tokens) as encoding/json decodes them into hasOutput's and cachedTokens' structs, which
// costs tens of thousands of instructions a chunk (reflection, a validating pre-scan, a
// decoder per call). quickOutput and quickCached give the same answers for the JSON engines
// send, reading it once; they give up (ok false) on everything whose decoding they do not
// mirror exactly, and the caller asks encoding/json then:
//
//   - a top level other than an object; nesting deeper than maxQuickDepth;
//   - any escape in a string (an escaped key could name a field), a control character, a key
//     that is not ASCII (encoding/json folds keys with Unicode's simple folding);
//   - a field of the structs appearing twice in one object (encoding/json decodes the second
//     into what the first left), or holding a value of another type (a decoding error);
//   - cached_tokens written other than as an integer of at most 18 digits;
//   - anything that is not JSON.
//
// Within that, a key names a struct field when they are equal under ASCII case folding (the
// fields' names fold to no other field's), null leaves a string as it was and sets a pointer to
// nil, and an unescaped string is empty exactly when its decoding is.

// maxQuickDepth bounds the nesting the quick readers follow (engines' chunks nest four deep);
// deeper JSON goes to encoding/json, whose own limit is 10,000.
const maxQuickDepth = 32

// quickJSON reads JSON in one forward pass; bad is set at the first thing it gives up on, after
// which every method returns at once.
type quickJSON struct {
	b   []byte
	i   int
	bad bool
}

func (q *quickJSON) ws() {
	for q.i < len(q.b) {
		switch q.b[q.i] {
		case ' ', '\t', '\n', '\r':
			q.i++
		default:
			return
		}
	}
}

// peek skips whitespace and returns the next byte, 0 at the end.
func (q *quickJSON) peek() byte {
	q.ws()
	if q.bad || q.i >= len(q.b) {
		return 0
	}
	return q.b[q.i]
}

// str reads a string at i (after whitespace) and returns its contents, which have no escapes.
func (q *quickJSON) str() []byte {
	if q.peek() != '"' {
		q.bad = true
		return nil
	}
	start := q.i + 1
	for j := start; j < len(q.b); j++ {
		switch c := q.b[j]; {
		case c == '"':
			q.i = j + 1
			return q.b[start:j]
		case c == '\\' || c < 0x20:
			q.bad = true
			return nil
		}
	}
	q.bad = true
	return nil
}

// key reads an object's key and its colon; a key that is not ASCII gives up.
func (q *quickJSON) key() []byte {
	k := q.str()
	for _, c := range k {
		if c >= 0x80 {
			q.bad = true
		}
	}
	if q.peek() != ':' {
		q.bad = true
		return nil
	}
	q.i++
	return k
}

// next reads what follows a member or element: true after ',', false after close (']' or '}').
func (q *quickJSON) next(close byte) bool {
	switch q.peek() {
	case ',':
		q.i++
		return true
	case close:
		q.i++
		return false
	}
	q.bad = true
	return false
}

// open reads c ('{' or '[') and reports whether the container is empty (its close read too).
func (q *quickJSON) open(c, close byte) bool {
	if q.peek() != c {
		q.bad = true
		return true
	}
	q.i++
	if q.peek() == close {
		q.i++
		return true
	}
	return false
}

// null reads a null if one is next.
func (q *quickJSON) null() bool {
	if q.peek() == 'n' && q.literal("null") {
		return true
	}
	return false
}

func (q *quickJSON) literal(s string) bool {
	if len(q.b)-q.i < len(s) || string(q.b[q.i:q.i+len(s)]) != s {
		q.bad = true
		return false
	}
	q.i += len(s)
	return true
}

// number reads a JSON number and reports whether it was an integer (no fraction or exponent).
func (q *quickJSON) number() (lit []byte, integer bool) {
	q.ws()
	start := q.i
	if q.i < len(q.b) && q.b[q.i] == '-' {
		q.i++
	}
	switch {
	case q.i < len(q.b) && q.b[q.i] == '0':
		q.i++
	case q.i < len(q.b) && q.b[q.i] >= '1' && q.b[q.i] <= '9':
		q.digits()
	default:
		q.bad = true
		return nil, false
	}
	integer = true
	if q.i < len(q.b) && q.b[q.i] == '.' {
		integer = false
		q.i++
		if q.digits() == 0 {
			q.bad = true
		}
	}
	if q.i < len(q.b) && (q.b[q.i] == 'e' || q.b[q.i] == 'E') {
		integer = false
		q.i++
		if q.i < len(q.b) && (q.b[q.i] == '+' || q.b[q.i] == '-') {
			q.i++
		}
		if q.digits() == 0 {
			q.bad = true
		}
	}
	return q.b[start:q.i], integer
}

func (q *quickJSON) digits() int {
	n := 0
	for q.i < len(q.b) && q.b[q.i] >= '0' && q.b[q.i] <= '9' {
		q.i++
		n++
	}
	return n
}

// skip reads any value at depth.
func (q *quickJSON) skip(depth int) {
	if depth > maxQuickDepth {
		q.bad = true
		return
	}
	switch c := q.peek(); {
	case c == '"':
		q.str()
	case c == '{':
		for empty := q.open('{', '}'); !empty && !q.bad; {
			q.key()
			q.skip(depth + 1)
			if !q.next('}') {
				break
			}
		}
	case c == '[':
		for empty := q.open('[', ']'); !empty && !q.bad; {
			q.skip(depth + 1)
			if !q.next(']') {
				break
			}
		}
	case c == 't':
		q.literal("true")
	case c == 'f':
		q.literal("false")
	case c == 'n':
		q.literal("null")
	case c == '-' || c >= '0' && c <= '9':
		q.number()
	default:
		q.bad = true
	}
}

// object reads an object at depth, calling member for each key with the reader at its value
// (member reads the value, or returns false to have it skipped). A key that member reports is
// a field (field ≥ 0, below 64) seen twice in the object gives up.
func (q *quickJSON) object(depth int, field func(key []byte) int, member func(f int, depth int)) {
	if depth > maxQuickDepth {
		q.bad = true
		return
	}
	var seen uint64
	for empty := q.open('{', '}'); !empty && !q.bad; {
		k := q.key()
		if f := field(k); f >= 0 && !q.bad {
			if seen&(1<<f) != 0 {
				q.bad = true
				return
			}
			seen |= 1 << f
			member(f, depth+1)
		} else {
			q.skip(depth + 1)
		}
		if !q.next('}') {
			break
		}
	}
}

// end reports whether the whole input was read: one value, then whitespace only.
func (q *quickJSON) end() bool {
	q.ws()
	return !q.bad && q.i == len(q.b)
}

// foldEq reports whether k equals name under ASCII case folding (name is lower case).
func foldEq(k []byte, name string) bool {
	if len(k) != len(name) {
		return false
	}
	for i := range k {
		c := k[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != name[i] {
			return false
		}
	}
	return true
}

// fieldOf is the index of the field in names k folds to, -1 for none.
func fieldOf(k []byte, names ...string) int {
	for i, n := range names {
		if foldEq(k, n) {
			return i
		}
	}
	return -1
}

// quickOutput is hasOutput's decoding: whether some choice has a non-empty text or
// delta.content; ok false when it gave up.
func quickOutput(b []byte) (out, ok bool) {
	q := quickJSON{b: b}
	if q.peek() != '{' {
		return false, false
	}
	q.object(0, func(k []byte) int { return fieldOf(k, "choices") }, func(_ int, depth int) {
		if q.null() {
			return
		}
		for empty := q.open('[', ']'); !empty && !q.bad; {
			if !q.null() {
				out = q.choice(depth+1) || out
			}
			if !q.next(']') {
				break
			}
		}
	})
	if !q.end() {
		return false, false
	}
	return out, true
}

// choice reads one element of choices and reports whether its text or delta.content is not
// empty.
func (q *quickJSON) choice(depth int) bool {
	var text, content bool
	q.object(depth, func(k []byte) int { return fieldOf(k, "text", "delta") }, func(f int, depth int) {
		if q.null() {
			return
		}
		if f == 0 {
			text = len(q.str()) > 0
			return
		}
		q.object(depth, func(k []byte) int { return fieldOf(k, "content") }, func(_ int, _ int) {
			if !q.null() {
				content = len(q.str()) > 0
			}
		})
	})
	return text || content
}

// maxQuickIntDigits is the longest cached_tokens quickCached reads: 18 digits always fit an int64.
const maxQuickIntDigits = 18

// quickCached is cachedTokens' decoding: usage.prompt_tokens_details.cached_tokens, found false
// when a level is missing or null; ok false when it gave up.
func quickCached(b []byte) (n int, found, ok bool) {
	q := quickJSON{b: b}
	if q.peek() != '{' {
		return 0, false, false
	}
	q.object(0, func(k []byte) int { return fieldOf(k, "usage") }, func(_ int, depth int) {
		if q.null() {
			return
		}
		q.object(depth, func(k []byte) int { return fieldOf(k, "prompt_tokens_details") }, func(_ int, depth int) {
			if q.null() {
				return
			}
			q.object(depth, func(k []byte) int { return fieldOf(k, "cached_tokens") }, func(_ int, _ int) {
				if q.null() {
					return
				}
				lit, integer := q.number()
				digits := len(lit)
				if len(lit) > 0 && lit[0] == '-' {
					digits--
				}
				if q.bad || !integer || digits > maxQuickIntDigits {
					q.bad = true
					return
				}
				v, err := strconv.Atoi(string(lit))
				if err != nil {
					q.bad = true
					return
				}
				n, found = v, true
			})
		})
	})
	if !q.end() {
		return 0, false, false
	}
	return n, found, true
}
