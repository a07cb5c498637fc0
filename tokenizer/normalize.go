package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/dlclark/regexp2/v2"
)

// normalizer rewrites one piece of text between added tokens (HF normalizers operate on the
// pieces, not on the whole input).
type normalizer interface {
	normalize(s string) string
}

// nfc is HF's NFC normalizer (nfc.go: Unicode 9.0.0, no stream-safe step).
type nfc struct{}

func (nfc) normalize(s string) string { return nfc9(s) }

// prepend adds its string in front of a non-empty piece.
type prepend struct{ s string }

func (p prepend) normalize(s string) string {
	if s == "" {
		return s
	}
	return p.s + s
}

// replace replaces every non-overlapping occurrence of a literal or a regex.
type replace struct {
	lit     string
	re      *regexp2.Regexp
	content string
}

func (r replace) normalize(s string) string {
	if r.re == nil {
		return strings.ReplaceAll(s, r.lit, r.content)
	}
	return regexReplaceAll(r.re, s, r.content)
}

type normSeq []normalizer

func (q normSeq) normalize(s string) string {
	for _, n := range q {
		s = n.normalize(s)
	}
	return s
}

// patternJSON is HF's pattern: {"String": "…"} or {"Regex": "…"}.
type patternJSON struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

func parseNormalizer(raw json.RawMessage) (normalizer, error) {
	typ, err := typedKind(raw, "normalizer")
	if err != nil || typ == "" {
		return nil, err
	}
	switch typ {
	case "NFC":
		return nfc{}, nil
	case "Prepend":
		var p struct {
			Prepend string `json:"prepend"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, err
		}
		return prepend{p.Prepend}, nil
	case "Replace":
		var p struct {
			Pattern patternJSON `json:"pattern"`
			Content string      `json:"content"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, err
		}
		r := replace{content: p.Content}
		switch {
		case p.Pattern.String != nil:
			r.lit = *p.Pattern.String
			if r.lit == "" {
				return nil, unsupported("Replace normalizer with an empty pattern")
			}
		case p.Pattern.Regex != nil:
			if r.re, err = compileHFRegex(*p.Pattern.Regex); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("Replace: pattern needs String or Regex")
		}
		return r, nil
	case "Sequence":
		q, err := parseSequence(raw, "normalizers", parseNormalizer)
		if err != nil {
			return nil, err
		}
		if len(q) == 0 {
			return nil, nil
		}
		return normSeq(q), nil
	}
	return nil, unsupported("normalizer %q", typ)
}
