package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"

	"github.com/dlclark/regexp2/v2"
)

// piece is a span of text on its way to the model; atStart says it begins at offset 0 of the
// input (Metaspace's prepend_scheme "first" depends on it).
type piece struct {
	s       string
	atStart bool
}

// preTokenizer splits one piece into smaller ones, appending them to dst; sc holds reusable
// buffers (so steady-state encoding does not allocate per match).
type preTokenizer interface {
	split(p piece, dst []piece, sc *scratch) ([]piece, error)
}

// scratch is the per-call working memory of pre-tokenization, pooled.
type scratch struct {
	ms         [][2]int
	spans, out []span
	a, b       []piece
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// putScratch pools sc unless a huge prompt grew it (see maxPooledRunes).
func putScratch(sc *scratch) {
	if cap(sc.ms) <= maxPooledRunes && cap(sc.spans) <= maxPooledRunes && cap(sc.a) <= maxPooledRunes && cap(sc.b) <= maxPooledRunes {
		scratchPool.Put(sc)
	}
}

// splitBehavior is HF's SplitDelimiterBehavior.
type splitBehavior int

const (
	behRemoved splitBehavior = iota
	behIsolated
	behMergedWithPrevious
	behMergedWithNext
	behContiguous
)

func parseBehavior(s string) (splitBehavior, error) {
	switch s {
	case "Removed":
		return behRemoved, nil
	case "Isolated":
		return behIsolated, nil
	case "MergedWithPrevious":
		return behMergedWithPrevious, nil
	case "MergedWithNext":
		return behMergedWithNext, nil
	case "Contiguous":
		return behContiguous, nil
	}
	return 0, unsupported("split behavior %q", s)
}

type span struct {
	start, end int
	match      bool
}

// splitSpans applies a behavior to the spans of s (matches and the gaps between them), as
// HF's NormalizedString::split does, appending the non-empty results to dst.
func splitSpans(p piece, spans []span, beh splitBehavior, dst []piece, sc *scratch) []piece {
	out := sc.out[:0]
	switch beh {
	case behIsolated, behRemoved:
		for _, sp := range spans { // spans is sc.spans: never alias it with sc.out
			if (beh == behIsolated || !sp.match) && sp.end > sp.start {
				dst = append(dst, piece{s: p.s[sp.start:sp.end], atStart: p.atStart && sp.start == 0})
			}
		}
		return dst
	case behContiguous:
		prev := false
		for _, sp := range spans {
			if sp.match == prev && len(out) > 0 {
				out[len(out)-1].end = sp.end
			} else {
				out = append(out, span{sp.start, sp.end, false})
			}
			prev = sp.match
		}
	case behMergedWithPrevious:
		prev := false
		for _, sp := range spans {
			if sp.match && !prev && len(out) > 0 {
				out[len(out)-1].end = sp.end
			} else {
				out = append(out, span{sp.start, sp.end, false})
			}
			prev = sp.match
		}
	case behMergedWithNext:
		prev := false
		for i := len(spans) - 1; i >= 0; i-- {
			sp := spans[i]
			if sp.match && !prev && len(out) > 0 {
				out[len(out)-1].start = sp.start
			} else {
				out = append(out, span{sp.start, sp.end, false})
			}
			prev = sp.match
		}
		for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
			out[i], out[j] = out[j], out[i]
		}
	}
	for _, sp := range out {
		if sp.end > sp.start {
			dst = append(dst, piece{s: p.s[sp.start:sp.end], atStart: p.atStart && sp.start == 0})
		}
	}
	sc.out = out[:0]
	return dst
}

// matchSpans turns match ranges into the covering list of spans, flipping match/gap if invert.
func matchSpans(s string, ms [][2]int, invert bool, spans []span) []span {
	prev := 0
	for _, m := range ms {
		if prev != m[0] {
			spans = append(spans, span{prev, m[0], invert})
		}
		spans = append(spans, span{m[0], m[1], !invert})
		prev = m[1]
	}
	if prev != len(s) {
		spans = append(spans, span{prev, len(s), invert})
	}
	return spans
}

// splitPre is HF's Split pre-tokenizer (a literal or a regex).
type splitPre struct {
	lit    string
	re     *regexp2.Regexp
	beh    splitBehavior
	invert bool
}

func (sp *splitPre) split(p piece, dst []piece, sc *scratch) ([]piece, error) {
	ms := sc.ms[:0]
	defer func() { sc.ms = ms[:0] }()
	if sp.re != nil {
		var err error
		if ms, err = findAll(sp.re, p.s, ms); err != nil {
			return dst, err
		}
	} else {
		for i := 0; i <= len(p.s)-len(sp.lit); {
			j := strings.Index(p.s[i:], sp.lit)
			if j < 0 {
				break
			}
			ms = append(ms, [2]int{i + j, i + j + len(sp.lit)})
			i += j + len(sp.lit)
		}
	}
	sc.spans = matchSpans(p.s, ms, sp.invert, sc.spans[:0])
	return splitSpans(p, sc.spans, sp.beh, dst, sc), nil
}

// gpt2Pattern is the regex ByteLevel uses when use_regex is true (HF byte_level.rs).
const gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

// byteLevelPre is HF's ByteLevel pre-tokenizer. The byte-to-alphabet mapping itself is done by
// the BPE model (it works on raw bytes), so this only prefixes a space and splits.
type byteLevelPre struct {
	addPrefixSpace bool
	re             *regexp2.Regexp // nil unless use_regex
}

func (b *byteLevelPre) split(p piece, dst []piece, sc *scratch) ([]piece, error) {
	if b.addPrefixSpace && !strings.HasPrefix(p.s, " ") {
		p.s = " " + p.s
	}
	if b.re == nil {
		return append(dst, p), nil
	}
	ms, err := findAll(b.re, p.s, sc.ms[:0])
	sc.ms = ms[:0]
	if err != nil {
		return dst, err
	}
	sc.spans = matchSpans(p.s, ms, false, sc.spans[:0])
	return splitSpans(p, sc.spans, behIsolated, dst, sc), nil
}

// metaspacePre is HF's Metaspace pre-tokenizer: spaces become the replacement character, which
// is prepended per prepend_scheme, and the piece is optionally split before each replacement.
type metaspacePre struct {
	repl   string
	scheme string // "always", "first", "never"
	split_ bool
}

func (m *metaspacePre) split(p piece, dst []piece, sc *scratch) ([]piece, error) {
	s := strings.ReplaceAll(p.s, " ", m.repl)
	switch m.scheme {
	case "always":
		if !strings.HasPrefix(s, m.repl) {
			s = m.repl + s
		}
	case "first":
		if !strings.HasPrefix(s, m.repl) && p.atStart {
			s = m.repl + s
		}
	}
	q := piece{s: s, atStart: p.atStart}
	if !m.split_ {
		return append(dst, q), nil
	}
	ms := sc.ms[:0]
	for i := 0; i < len(s); {
		j := strings.Index(s[i:], m.repl)
		if j < 0 {
			break
		}
		ms = append(ms, [2]int{i + j, i + j + len(m.repl)})
		i += j + len(m.repl)
	}
	sc.ms = ms[:0]
	sc.spans = matchSpans(s, ms, false, sc.spans[:0])
	return splitSpans(q, sc.spans, behMergedWithNext, dst, sc), nil
}

// preSeq applies each pre-tokenizer to every piece the previous one produced.
type preSeq []preTokenizer

// split alternates between two pooled buffers; the result is in one of them, valid until the
// scratch is reused (the caller consumes it first).
func (q preSeq) split(p piece, _ []piece, sc *scratch) ([]piece, error) {
	cur := append(sc.a[:0], p)
	next := sc.b[:0]
	for _, pt := range q {
		next = next[:0]
		for _, c := range cur {
			var err error
			if next, err = pt.split(c, next, sc); err != nil {
				return nil, err
			}
		}
		cur, next = next, cur
	}
	sc.a, sc.b = cur[:0], next[:0]
	return cur, nil
}

// byteLevel reports whether the model sees byte-level text: ByteLevel is the last step.
func (q preSeq) byteLevel() bool {
	if len(q) == 0 {
		return false
	}
	_, ok := q[len(q)-1].(*byteLevelPre)
	return ok
}

func parsePreTokenizer(raw json.RawMessage) (preSeq, error) {
	typ, err := typedKind(raw, "pre_tokenizer")
	if err != nil || typ == "" {
		return nil, err
	}
	switch typ {
	case "Sequence":
		var p struct {
			Pretokenizers []json.RawMessage `json:"pretokenizers"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, err
		}
		var q preSeq
		for i, c := range p.Pretokenizers {
			sub, err := parsePreTokenizer(c)
			if err != nil {
				return nil, fmt.Errorf("Sequence[%d]: %w", i, err)
			}
			q = append(q, sub...)
		}
		for i, pt := range q {
			if _, ok := pt.(*byteLevelPre); ok && i != len(q)-1 {
				return nil, unsupported("ByteLevel pre-tokenizer before another pre-tokenizer")
			}
		}
		return q, nil
	case "Split":
		var p struct {
			Pattern  patternJSON `json:"pattern"`
			Behavior string      `json:"behavior"`
			Invert   bool        `json:"invert"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, err
		}
		sp := &splitPre{invert: p.Invert}
		if sp.beh, err = parseBehavior(p.Behavior); err != nil {
			return nil, err
		}
		switch {
		case p.Pattern.String != nil:
			if sp.lit = *p.Pattern.String; sp.lit == "" {
				return nil, unsupported("Split with an empty pattern")
			}
		case p.Pattern.Regex != nil:
			if sp.re, err = compileHFRegex(*p.Pattern.Regex); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("Split: pattern needs String or Regex")
		}
		return preSeq{sp}, nil
	case "ByteLevel":
		var p struct {
			AddPrefixSpace bool  `json:"add_prefix_space"`
			UseRegex       *bool `json:"use_regex"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, err
		}
		b := &byteLevelPre{addPrefixSpace: p.AddPrefixSpace}
		if p.UseRegex == nil || *p.UseRegex { // HF's default is true
			if b.re, err = compileHFRegex(gpt2Pattern); err != nil {
				return nil, err
			}
		}
		return preSeq{b}, nil
	case "Metaspace":
		var p struct {
			Replacement    string  `json:"replacement"`
			PrependScheme  *string `json:"prepend_scheme"`
			AddPrefixSpace *bool   `json:"add_prefix_space"`
			Split          *bool   `json:"split"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, err
		}
		m := &metaspacePre{repl: p.Replacement, scheme: "always", split_: true}
		if m.repl == "" {
			return nil, unsupported("Metaspace with an empty replacement")
		}
		if p.PrependScheme != nil {
			m.scheme = *p.PrependScheme
		} else if p.AddPrefixSpace != nil && !*p.AddPrefixSpace {
			m.scheme = "never" // the legacy field
		}
		if m.scheme != "always" && m.scheme != "first" && m.scheme != "never" {
			return nil, unsupported("Metaspace prepend_scheme %q", m.scheme)
		}
		if p.Split != nil {
			m.split_ = *p.Split
		}
		return preSeq{m}, nil
	}
	return nil, unsupported("pre_tokenizer %q", typ)
}
