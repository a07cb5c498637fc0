package tokenizer

import (
	"fmt"
	"strings"
	"sync"

	"github.com/dlclark/regexp2/v2"
)

// compileHFRegex compiles a tokenizer.json regex (Oniguruma syntax in HF's Rust core) with
// regexp2, which has the lookaheads Go's regexp lacks. Its default (.NET) mode has the same
// meaning for the constructs HF files use: \s, (?i:…), (?!…), classes; \p{…} and \d are first
// spelled out in Oniguruma's Unicode version (unicode.go). The golden tests and the code-point
// sweep pin the equivalence on every supported model.
func compileHFRegex(pat string) (*regexp2.Regexp, error) {
	spelled, err := spellUnicodeClasses(pat)
	if err != nil {
		return nil, err
	}
	re, err := regexp2.Compile(spelled, regexp2.None)
	if err != nil {
		return nil, unsupported("regex %q: %v", pat, err)
	}
	return re, nil
}

// runeBuf holds a piece decoded to runes and each rune's byte offset, pooled per call.
type runeBuf struct {
	runes []rune
	offs  []int32 // offs[i] is the byte offset of runes[i]; offs[len] = len(s)
}

var runeBufPool = sync.Pool{New: func() any { return new(runeBuf) }}

// maxPooledRunes: buffers grown past this (a 1 MiB prompt) are dropped rather than pooled, so
// one huge request does not pin tens of megabytes.
const maxPooledRunes = 1 << 20

func putRuneBuf(b *runeBuf) {
	if cap(b.runes) <= maxPooledRunes {
		runeBufPool.Put(b)
	}
}

func (b *runeBuf) load(s string) {
	b.runes = b.runes[:0]
	b.offs = b.offs[:0]
	// s is valid UTF-8 (Encode repairs its input first, as HF's input is a Rust &str).
	for i, r := range s {
		b.runes = append(b.runes, r)
		b.offs = append(b.offs, int32(i))
	}
	b.offs = append(b.offs, int32(len(s)))
}

// findAll appends the byte ranges [start,end) of the successive non-empty matches of re in s.
func findAll(re *regexp2.Regexp, s string, dst [][2]int) ([][2]int, error) {
	b := runeBufPool.Get().(*runeBuf)
	defer putRuneBuf(b)
	b.load(s)
	err := re.FindRunesMatches(b.runes, 0, func(m regexp2.MatchView) bool {
		i, n, ok := m.GroupRange(0)
		if ok && n > 0 {
			dst = append(dst, [2]int{int(b.offs[i]), int(b.offs[i+n])})
		}
		return true
	})
	if err != nil {
		return dst, fmt.Errorf("regex match: %w", err)
	}
	return dst, nil
}

// regexReplaceAll replaces every match of re in s by content (literally).
func regexReplaceAll(re *regexp2.Regexp, s, content string) string {
	ms, err := findAll(re, s, nil)
	if err != nil || len(ms) == 0 {
		return s
	}
	var sb strings.Builder
	prev := 0
	for _, m := range ms {
		sb.WriteString(s[prev:m[0]])
		sb.WriteString(content)
		prev = m[1]
	}
	sb.WriteString(s[prev:])
	return sb.String()
}
