package chat

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/prefixmesh/prefixmesh/tokenizer"
)

// The Go engine (github.com/ardanlabs/jinja) prints values its own way: floats with %g, None as
// "", tojson through encoding/json (U+2028 escaped), trim with Go's whitespace. Its built-in
// filters cannot be replaced, but a filter it does not know is looked up among the render's
// variables. So the template source is rewritten before compiling: | tojson, | trim and
// | string call this package's Python versions (python.go), and every {{ expr }} prints
// through __pm_str(expr), which gives str() of floats, None and containers as Python does and
// hands every other value back unchanged. What is left that prints a value the Go way is
// recorded (templateFeatures) so a request that would hit it is refused, not rendered wrong.

// Names of the replacement callables (reserved: a template variable cannot start with them).
const (
	pmPrefix   = "__pm_"
	pmStr      = pmPrefix + "str"
	pmTojson   = pmPrefix + "tojson"
	pmTrim     = pmPrefix + "trim"
	pmStringFn = pmPrefix + "string"
)

// replacedFilters are the filters rewritten to a Python version.
var replacedFilters = map[string]string{"tojson": pmTojson, "trim": pmTrim, "string": pmStringFn}

// stringifyingFilters print their input (or its items) with the Go engine's str(): a float, or
// an integer beyond int64, given to them would print differently from Python.
var stringifyingFilters = map[string]bool{
	"join": true, "format": true, "e": true, "escape": true, "forceescape": true, "indent": true,
	"replace": true, "lower": true, "upper": true, "title": true, "capitalize": true, "center": true,
	"truncate": true, "wordcount": true, "wordwrap": true, "urlencode": true, "pprint": true,
	"striptags": true, "xmlattr": true, "safe": true, "map": true, "sum": true,
}

// whitespaceMethods split or strip on Python's whitespace when called without arguments.
var whitespaceMethods = map[string]bool{"strip": true, "lstrip": true, "rstrip": true, "split": true, "rsplit": true}

// templateFeatures are the constructs of a template that print or inspect values the Go way.
type templateFeatures struct {
	stringifies  bool // ~, join, format, '…' % x … (a number there prints as Go prints it)
	pyWhitespace bool // .strip() / .split() / .splitlines() with Python's whitespace or line breaks
	numberTypes  bool // "is integer", "is float", | int, | float (a big integer is a float here)
}

var rawBlock = regexp.MustCompile(`^\{%[-+]?\s*raw\s*[-+]?%\}`)
var endRaw = regexp.MustCompile(`\{%[-+]?\s*endraw\s*[-+]?%\}`)

// rewriteTemplate returns the template source with the replacements above, and its features.
func rewriteTemplate(src string) (string, templateFeatures, error) {
	var sb strings.Builder
	var f templateFeatures
	i := 0
	for i < len(src) {
		j := strings.IndexByte(src[i:], '{')
		if j < 0 || i+j+1 >= len(src) {
			sb.WriteString(src[i:])
			break
		}
		j += i
		switch src[j+1] {
		case '#':
			end := strings.Index(src[j+2:], "#}")
			if end < 0 {
				return "", f, fmt.Errorf("%w: unterminated comment", errTemplateSyntax)
			}
			sb.WriteString(src[i : j+2+end+2])
			i = j + 2 + end + 2
			continue
		case '%', '{':
		default:
			sb.WriteString(src[i : j+1])
			i = j + 1
			continue
		}
		sb.WriteString(src[i:j])
		if m := rawBlock.FindString(src[j:]); m != "" {
			loc := endRaw.FindStringIndex(src[j+len(m):])
			if loc == nil {
				return "", f, fmt.Errorf("%w: unterminated raw block", errTemplateSyntax)
			}
			end := j + len(m) + loc[1]
			sb.WriteString(src[j:end])
			i = end
			continue
		}
		n, err := rewriteTag(&sb, src[j:], &f)
		if err != nil {
			return "", f, err
		}
		i = j + n
	}
	return sb.String(), f, nil
}

var errTemplateSyntax = fmt.Errorf("%w: chat template", tokenizer.ErrUnsupported)

// tok is a token of a tag: an identifier, a string literal, one punctuation byte, a space.
type tok struct {
	kind int
	text string
}

// token kinds of the tag scanner.
const (
	tkOther = iota
	tkIdent
	tkString
	tkPunct
)

// rewriteTag rewrites one {{ … }} or {% … %} at the start of s and returns its length.
func rewriteTag(sb *strings.Builder, s string, f *templateFeatures) (int, error) {
	output := s[1] == '{'
	closer := byte('%')
	if output {
		closer = '}'
	}
	i := 2
	open := s[:2]
	if i < len(s) && (s[i] == '-' || s[i] == '+') {
		open = s[:3]
		i++
	}
	// Scan tokens to the closing marker at bracket depth 0.
	var toks []tok
	depth := 0
	end, closeMark := -1, ""
scan:
	for i < len(s) {
		c := s[i]
		switch {
		case depth == 0 && (c == '-' || c == '+') && i+2 < len(s) && s[i+1] == closer && s[i+2] == '}':
			end, closeMark = i, s[i:i+3]
			break scan
		case depth == 0 && c == closer && i+1 < len(s) && s[i+1] == '}':
			end, closeMark = i, s[i:i+2]
			break scan
		case c == '\'' || c == '"':
			k := i + 1
			for k < len(s) && s[k] != c {
				if s[k] == '\\' {
					k++
				}
				k++
			}
			if k >= len(s) {
				return 0, fmt.Errorf("%w: unterminated string", errTemplateSyntax)
			}
			toks = append(toks, tok{tkString, s[i : k+1]})
			i = k + 1
			continue
		case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
			if (c == 'e' || c == 'E') && i > 0 && s[i-1] >= '0' && s[i-1] <= '9' {
				// The Go engine reads 1e3 as 1 followed by a name.
				return 0, fmt.Errorf("%w: a number literal with an exponent", errTemplateSyntax)
			}
			k := i + 1
			for k < len(s) && (s[k] == '_' || s[k] >= 'a' && s[k] <= 'z' || s[k] >= 'A' && s[k] <= 'Z' || s[k] >= '0' && s[k] <= '9') {
				k++
			}
			toks = append(toks, tok{tkIdent, s[i:k]})
			i = k
			continue
		case c == '(' || c == '[' || c == '{':
			depth++
			toks = append(toks, tok{tkPunct, s[i : i+1]})
		case c == ')' || c == ']' || c == '}':
			depth--
			toks = append(toks, tok{tkPunct, s[i : i+1]})
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			toks = append(toks, tok{tkOther, s[i : i+1]})
		default:
			toks = append(toks, tok{tkPunct, s[i : i+1]})
		}
		i++
	}
	if end < 0 {
		return 0, fmt.Errorf("%w: unterminated tag %q", errTemplateSyntax, open)
	}
	// Significant-token helpers.
	prev := func(k int) (tok, int) {
		for k--; k >= 0; k-- {
			if toks[k].kind != tkOther {
				return toks[k], k
			}
		}
		return tok{}, -1
	}
	next := func(k int) (tok, int) {
		for k++; k < len(toks); k++ {
			if toks[k].kind != tkOther {
				return toks[k], k
			}
		}
		return tok{}, len(toks)
	}
	var body strings.Builder
	for k, t := range toks {
		text := t.text
		p, _ := prev(k)
		switch {
		case t.kind == tkIdent && strings.HasPrefix(t.text, pmPrefix):
			return 0, fmt.Errorf("%w: the name %q is reserved", errTemplateSyntax, t.text)
		case t.kind == tkIdent && p.text == "|":
			if r, ok := replacedFilters[t.text]; ok {
				text = r
			}
			if stringifyingFilters[t.text] {
				f.stringifies = true
			}
			if t.text == "int" || t.text == "float" {
				f.numberTypes = true
			}
			if t.text == "map" || t.text == "select" || t.text == "reject" {
				// map('tojson') and the like run the engine's own filter by name.
				if a, ka := next(k); a.text == "(" {
					if arg, _ := next(ka); arg.kind == tkString {
						name := strings.Trim(arg.text, `'"`)
						if _, ok := replacedFilters[name]; ok {
							return 0, fmt.Errorf("%w: filter %q applied through %s()", tokenizer.ErrUnsupported, name, t.text)
						}
					}
				}
			}
		case t.kind == tkIdent && !output && k == firstIdent(toks) && t.text == "filter":
			if a, _ := next(k); a.kind == tkIdent {
				if _, ok := replacedFilters[a.text]; ok {
					return 0, fmt.Errorf("%w: a {%% filter %s %%} block", tokenizer.ErrUnsupported, a.text)
				}
				if stringifyingFilters[a.text] {
					f.stringifies = true
				}
			}
		case t.kind == tkIdent && p.text == ".":
			if t.text == "format" {
				f.stringifies = true
			}
			a, ka := next(k)
			if a.text == "(" {
				b, _ := next(ka)
				if whitespaceMethods[t.text] && b.text == ")" || t.text == "splitlines" {
					f.pyWhitespace = true
				}
			}
		case t.kind == tkIdent && (p.text == "is" || p.text == "not" && prevIs(toks, k)):
			if t.text == "integer" || t.text == "float" {
				f.numberTypes = true
			}
		case t.kind == tkPunct && t.text == "~":
			f.stringifies = true
		case t.kind == tkPunct && t.text == "%" && p.kind == tkString:
			f.stringifies = true
		}
		body.WriteString(text)
	}
	sb.WriteString(open)
	if output {
		sb.WriteString(" " + pmStr + "(")
		sb.WriteString(body.String())
		sb.WriteString(") ")
	} else {
		sb.WriteString(body.String())
	}
	sb.WriteString(closeMark)
	return end + len(closeMark), nil
}

// firstIdent is the index of the tag's first token if it is an identifier, else -1.
func firstIdent(toks []tok) int {
	for k, t := range toks {
		if t.kind == tkIdent {
			return k
		}
		if t.kind != tkOther {
			return -1
		}
	}
	return -1
}

// prevIs reports whether the token before the "not" before toks[k] is "is".
func prevIs(toks []tok, k int) bool {
	n := 0
	for k--; k >= 0; k-- {
		if toks[k].kind == tkOther {
			continue
		}
		if n++; n == 2 {
			return toks[k].text == "is"
		}
	}
	return false
}
